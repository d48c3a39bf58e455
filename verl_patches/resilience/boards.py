"""Where heartbeats are published and read: Ray's GCS key-value store in a Ray job (every node and the
driver reach it), or a torch.distributed store (the CPU proof's plain gloo processes)."""

from __future__ import annotations

from typing import Any, Protocol

RAY_NAMESPACE = "verl_patches_heartbeat"


class Board(Protocol):
    def publish(self, key: str, value: str) -> None: ...

    def read(self, keys: list[str]) -> dict[str, str | None]: ...


class RayKVBoard:
    """Ray's internal key-value store (the GCS): one key per worker process, overwritten each beat."""

    def __init__(self, namespace: str = RAY_NAMESPACE) -> None:
        self.namespace = namespace

    def publish(self, key: str, value: str) -> None:
        # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key, value, overwrite=True, namespace=self.namespace)

    def read(self, keys: list[str]) -> dict[str, str | None]:
        # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
        from ray.experimental import internal_kv

        client = internal_kv.internal_kv_get_gcs_client()
        multi = getattr(client, "internal_kv_multi_get", None)
        if multi is not None and keys:
            found = multi([k.encode() for k in keys], self.namespace.encode())
            return {k: _text(found.get(k.encode())) for k in keys}
        return {k: _text(internal_kv._internal_kv_get(k, namespace=self.namespace)) for k in keys}


class StoreBoard:
    """A torch.distributed Store (TCPStore, FileStore, ...)."""

    PREFIX = "verl_patches/heartbeat/"

    def __init__(self, store: Any) -> None:
        self.store = store

    def publish(self, key: str, value: str) -> None:
        self.store.set(self.PREFIX + key, value)

    def read(self, keys: list[str]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for k in keys:
            full = self.PREFIX + k
            out[k] = _text(self.store.get(full)) if self.store.check([full]) else None  # get blocks on a missing key
        return out


class DictBoard:
    """In memory (unit tests and the benchmark)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def publish(self, key: str, value: str) -> None:
        self.values[key] = value

    def read(self, keys: list[str]) -> dict[str, str | None]:
        return {k: self.values.get(k) for k in keys}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)
