"""Worker-side D2D tensor cache (vendor items C2 and the D2D part of A2/C1).

Rollout outputs stay on the worker's device between generate, ref and update, so the driver ships only
what it must (prompts/responses/masks for the reward; advantages for the update). Each entry is one batch
tensor under its name, in one of two row layouts:

* ``"rollout"``: this rank's rollout chunk (chunk index == global rank), as generate left it;
* ``"megatron_dp"``: this rank's Megatron data-parallel slice.

`TensorCache.get` returns entries in the Megatron layout, resharding a rollout entry once with the DP
re-layout plan and executor and replacing it, so the update finds it already resharded. The plan's
Megatron DP rank of every global rank comes from the layout the cache was built with, or, once a call
hands it over (`set_dp_rank_map`, ``get(..., dp_ranks=...)``), from the MEGATRON_COMPUTE_PROTO dispatch's
map (B1, ``meta_info["global_megatron_dp_ranks"]``), which is what the driver's split follows.

Differences from the vendor's cache, on purpose: putting a key that is already cached raises
`TensorCacheKeyExistsError` unless ``overwrite=True`` (the vendor silently kept the stale tensor);
`clear` is meant to be called after every step; `size_report` says what is held.

The preconditions (`check_tensor_cache_preconditions`) are checked on the verl config before the cache
is enabled, because with the cache on the driver never sees ``ref_log_prob`` or ``old_log_probs``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from omegaconf import OmegaConf

from verl_patches.reshard.dp_plan import DpRankMap, DpRelayoutPlan, equal_chunk_rows, plan_dp_relayout
from verl_patches.reshard.errors import (
    PlanMismatchError,
    TensorCacheKeyExistsError,
    TensorCacheMissingKeyError,
    TensorCachePreconditionError,
)
from verl_patches.reshard.executors import relayout_rows
from verl_patches.reshard.layout import MegatronLayout

RowLayout = Literal["rollout", "megatron_dp"]
Relayout = Callable[..., torch.Tensor]

_MISSING = object()

# key → (required value, why); checked in this order.
PRECONDITIONS: dict[str, tuple[Any, str]] = {
    "actor_rollout_ref.actor.use_kl_loss": (
        True,
        "must be true: the update reads ref_log_prob from the cache, so the KL must be a loss term",
    ),
    "algorithm.use_kl_in_reward": (
        False,
        "must be false: an in-reward KL needs ref_log_prob on the driver, which never gets it",
    ),
    "algorithm.adv_estimator": ("grpo", "must be 'grpo': other estimators need a critic or log-probs on the driver"),
    "trainer.balance_batch": (
        False,
        "must be false: reordering rows on the driver breaks the row order the cache relies on",
    ),
}


def check_tensor_cache_preconditions(config: Any) -> None:
    """Raise `TensorCachePreconditionError` naming every config key that forbids the cache."""
    violations: dict[str, str] = {}
    for key, (want, why) in PRECONDITIONS.items():
        got = OmegaConf.select(config, key, default=_MISSING)
        if got is _MISSING:
            violations[key] = f"missing; {why}"
        elif got != want:
            violations[key] = f"is {got!r}; {why}"
    if violations:
        raise TensorCachePreconditionError(violations)


def global_rollout_rows(config: Any) -> int:
    """Rows of one step's rollout batch: ``data.train_batch_size * actor_rollout_ref.rollout.n``."""
    return int(OmegaConf.select(config, "data.train_batch_size")) * int(
        OmegaConf.select(config, "actor_rollout_ref.rollout.n", default=1)
    )


@dataclass(frozen=True)
class CacheSizeReport:
    bytes_per_key: dict[str, int]
    layout_per_key: dict[str, str]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_per_key.values())

    def __str__(self) -> str:
        parts = [f"{k}={b / 2**20:.2f}MiB({self.layout_per_key[k]})" for k, b in self.bytes_per_key.items()]
        return f"tensor cache: {len(parts)} keys, {self.total_bytes / 2**20:.2f} MiB [{', '.join(parts)}]"


class TensorCache:
    """Per-worker cache of batch tensors keyed by name (see the module docstring)."""

    def __init__(
        self,
        training: MegatronLayout | DpRankMap,
        rank: int,
        global_rows: int,
        group: Any = None,
        relayout: Relayout = relayout_rows,
    ) -> None:
        self.training = training
        self.rank = rank
        self.global_rows = global_rows
        self.group = group
        self._relayout = relayout
        self._plan: DpRelayoutPlan = plan_dp_relayout(training, equal_chunk_rows(global_rows, training.world_size))
        self._entries: dict[str, tuple[torch.Tensor, RowLayout]] = {}

    @classmethod
    def from_config(
        cls, config: Any, training: MegatronLayout, rank: int, group: Any = None, relayout: Relayout = relayout_rows
    ) -> TensorCache:
        """Check the preconditions, then size the cache for one step's rollout batch."""
        check_tensor_cache_preconditions(config)
        return cls(training, rank, global_rollout_rows(config), group, relayout)

    # ------------------------------------------------------------------------------------ content

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        return list(self._entries)

    def layout_of(self, key: str) -> RowLayout:
        return self._entry(key)[1]

    def dp_ranks(self) -> tuple[int, ...]:
        """The Megatron DP rank of every global rank, as the current plan has it."""
        return tuple(self.training.dp_rank(r) for r in range(self.training.world_size))

    def set_dp_rank_map(self, dp_ranks: Sequence[int]) -> None:
        """Plan the re-layout with this map (global rank -> Megatron DP rank) from now on.

        Refused while an entry already resharded with a different map is held: its rows would be the
        wrong slice. The world size must be the cache's.
        """
        ranks = tuple(int(d) for d in dp_ranks)
        if ranks == self.dp_ranks():
            return
        new = DpRankMap(ranks)
        if new.world_size != self.training.world_size:
            raise PlanMismatchError(
                f"rank {self.rank}: the Megatron DP rank map has {new.world_size} entries, the "
                f"tensor cache was built for world size {self.training.world_size}"
            )
        moved = [k for k, (_, lay) in self._entries.items() if lay == "megatron_dp"]
        if moved:
            raise PlanMismatchError(
                f"rank {self.rank}: the Megatron DP rank map changed to {list(ranks)} (was "
                f"{list(self.dp_ranks())}) while {moved} are held in the old DP layout"
            )
        self.training = new
        self._plan = plan_dp_relayout(new, self._plan.chunk_rows)

    @property
    def rows_per_dp_rank(self) -> int:
        """Rows of an entry in the Megatron DP layout."""
        return self._plan.rows_per_dp_rank

    def put(self, key: str, tensor: torch.Tensor, *, overwrite: bool = False, layout: RowLayout = "rollout") -> None:
        if key in self._entries and not overwrite:
            raise TensorCacheKeyExistsError(key)
        expect = self._expected_rows(layout)
        if tensor.shape[0] != expect:
            raise PlanMismatchError(
                f"rank {self.rank}: {key!r} has {tensor.shape[0]} rows, a {layout} entry must have {expect}"
            )
        self._entries[key] = (tensor, layout)

    def cache_tensors(
        self,
        data: Any,
        keys: Iterable[str] | None = None,
        *,
        keys_to_reserve: Sequence[str] = (),
        keys_no_cache: Sequence[str] = (),
        overwrite: bool = False,
        device: Any = None,
    ) -> Any:
        """Cache batch tensors of a verl ``DataProto`` (rollout layout) and pop them from it.

        ``keys`` defaults to every batch key; ``keys_no_cache`` are left alone; ``keys_to_reserve`` are
        cached but also left in ``data`` for the driver. ``device``: where the cached copies live (the
        reshard's collective runs on that device's backend; HCCL takes no host tensors); the tensors left
        in ``data`` are not moved. All or nothing: nothing is cached when a key or a row count is wrong.
        Returns ``data``.
        """
        names = list(data.batch.keys()) if keys is None else list(keys)
        names = [k for k in names if k not in keys_no_cache]
        for key in names:
            if key in self._entries and not overwrite:
                raise TensorCacheKeyExistsError(key)
            rows, expect = data.batch[key].shape[0], self._expected_rows("rollout")
            if rows != expect:
                raise PlanMismatchError(
                    f"rank {self.rank}: {key!r} has {rows} rows, a rollout entry must have {expect}"
                )
        for key in names:
            tensor = data.batch[key]
            self.put(key, tensor if device is None else tensor.to(device), overwrite=overwrite)
        for key in names:
            if key not in keys_to_reserve:
                data.batch.pop(key)
        return data

    def peek(self, key: str) -> tuple[torch.Tensor, RowLayout]:
        """The stored tensor and its row layout, without resharding."""
        return self._entry(key)

    def get_tensor(self, key: str) -> torch.Tensor:
        """The entry in Megatron DP layout, resharding (once, in place) a rollout-layout entry."""
        tensor, layout = self._entry(key)
        if layout == "rollout":
            if not self._plan.is_identity:  # every rank takes the same branch: the plan is global
                tensor = self._relayout(self._plan, self.rank, tensor, group=self.group)
            self._entries[key] = (tensor, "megatron_dp")
        return tensor

    def get(self, keys: Sequence[str], dp_ranks: Sequence[int] | None = None) -> Any:
        """A ``DataProto`` of the named entries, all in Megatron DP layout (``dp_ranks``: see
        `set_dp_rank_map`).

        Every rank must call this with the same keys in the same order (each reshard is a collective).
        """
        # deferred: importing this module must not load verl; it loads once the prelude patched it
        from verl.protocol import DataProto

        if dp_ranks is not None:
            self.set_dp_rank_map(dp_ranks)
        return DataProto.from_dict(tensors={k: self.get_tensor(k) for k in keys})

    def clear(self) -> None:
        self._entries.clear()

    def size_report(self) -> CacheSizeReport:
        return CacheSizeReport(
            {k: t.numel() * t.element_size() for k, (t, _) in self._entries.items()},
            {k: lay for k, (_, lay) in self._entries.items()},
        )

    # ------------------------------------------------------------------------------------ helpers

    def _entry(self, key: str) -> tuple[torch.Tensor, RowLayout]:
        if key not in self._entries:
            raise TensorCacheMissingKeyError(key, self.keys())
        return self._entries[key]

    def _expected_rows(self, layout: RowLayout) -> int:
        if layout == "rollout":
            return self._plan.chunk_rows[self.rank]
        if layout == "megatron_dp":
            return self._plan.rows_per_dp_rank
        raise ValueError(f"unknown row layout {layout!r}")
