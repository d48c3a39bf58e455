"""The nearest existing key for a Hydra override whose key the config does not have.

Hydra answers ``trainer.save_freqq=5`` with "To append to your config use +trainer.save_freqq=5": advice that
adds a key nothing reads, and the run goes on without checkpoints. The launcher, the dry run and the trainer
entry name the key that was probably meant instead, found segment by segment (difflib), so a typo in any
part of a long path (``actor_rollout_ref.actr.optim.lr``) is found under the right parent.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from typing import Any

# Hydra 1.3's messages for an override whose key is absent (ConfigCompositionException)
_UNKNOWN_KEY = (
    re.compile(r"Could not override '([^']+)'"),
    re.compile(r"Could not delete from config\. '([^']+)' does not exist"),
)
CUTOFF = 0.6  # difflib's default: below it, two names share too little to be one typo of the other


def unknown_override_key(message: str) -> str | None:
    """The key of a Hydra error about an override whose key the config lacks, else None."""
    for pattern in _UNKNOWN_KEY:
        m = pattern.search(message)
        if m:
            return m.group(1)
    return None


def _keys(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield f"{prefix}{k}"
            yield from _keys(v, f"{prefix}{k}.")


def nearest_key(config: Mapping[str, Any], key: str) -> str | None:
    """The existing key closest to `key` (a dotted path), or None when nothing is close.

    Walks the path: each segment that exists is kept; one that does not is replaced by its closest sibling.
    When a segment has no close sibling, the key may sit under another parent (`actor_rollout_ref.rollout.
    save_freq` for `trainer.save_freq`): the rest of the path, from that segment on, is compared with the ends
    of every key of the config."""
    node: Any = config
    parts = key.split(".")
    path: list[str] = []
    for i, part in enumerate(parts):
        if not isinstance(node, Mapping):  # `trainer.save_freq.x`: the path went past a value
            return ".".join(path) if path else None
        if part in node:
            path.append(part)
            node = node[part]
            continue
        close = difflib.get_close_matches(part, [str(k) for k in node], n=1, cutoff=CUTOFF)
        if not close:
            return _elsewhere(config, parts[i:])
        path.append(close[0])
        node = node[close[0]]
    found = ".".join(path)
    return found if found != key else None


def _elsewhere(config: Mapping[str, Any], rest: list[str]) -> str | None:
    """The key whose last len(rest) segments are closest to `rest` (the first in the config's order on a tie)."""
    n, wanted = len(rest), ".".join(rest)
    best: tuple[float, str] | None = None
    for k in _keys(config):
        tail = k.split(".")[-n:]
        if len(tail) < n:
            continue
        ratio = difflib.SequenceMatcher(None, wanted, ".".join(tail)).ratio()
        if ratio >= CUTOFF and (best is None or ratio > best[0]):
            best = (ratio, k)
    return best[1] if best else None


def unknown_key_message(config_name: str, key: str, override: str | None, near: str | None) -> str:
    """One line naming the unknown key, the override it came from and the nearest key (or how to add one)."""
    origin = f" (from the override {override!r})" if override else ""
    if near:
        return f"config {config_name!r}: no key '{key}'{origin}; the nearest key is '{near}'"
    parent = key.rpartition(".")[0]
    where = f" under '{parent}'" if parent else ""
    if override and override.startswith("~"):
        return f"config {config_name!r}: no key '{key}'{origin} and none like it{where}: nothing to delete"
    return (
        f"config {config_name!r}: no key '{key}'{origin} and none like it{where}; a key the config does not have "
        f"is added with '+{override or key + '=...'}'"
    )


__all__ = ["unknown_override_key", "nearest_key", "unknown_key_message"]
