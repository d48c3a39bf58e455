"""Rank layouts of the two phases: Megatron training and vLLM rollout (pure, no torch.distributed).

Training (Megatron core 0.8.0 `RankGenerator` semantics, re-implemented here so planners run anywhere):
  * The order string, fastest-varying axis first (default ``tp-cp-ep-dp-pp``), decomposes a global rank
    into one index per axis: ``rank = sum(index[a] * prod(size[b] for b before a))``.
  * Two decompositions exist. *Without EP* the axes are tp, cp, dp, pp with ``dp = world/(tp*cp*pp)``;
    it gives the full data-parallel rank. *With EP* the ``dp`` axis is split into ``ep`` and
    ``dp/ep`` (ep must sit next to dp in the order); it gives the expert-parallel rank.
  * A group for a token set such as ``tp-ep`` lists, for each fixed value of the other axes, the ranks
    obtained by varying the named axes (first named axis fastest), exactly as
    ``RankGenerator.get_ranks(token, independent_ep)`` does. Group lists are ascending, which is also
    the group-rank order torch.distributed uses.
  * TP-extend-EP (MindSpeed ``moe_tp_extend_ep``): routed experts are spread over the TP×EP ranks.
    The rank with expert-parallel rank ``e`` and tensor-parallel rank ``t`` holds the *expert block*
    ``b = e*tp + t``, i.e. global experts ``[b*E_local, (b+1)*E_local)`` with ``E_local = E/(tp*ep)``.
    Every TP×EP group of a pipeline stage therefore holds all experts of that stage's MoE layers once.

Rollout (vLLM 0.9.1 with ``enable_expert_parallel``, verl's colocated layout):
  * ``tp`` ranks per engine, ``dp_per_instance`` engines (``VLLM_DP_SIZE``) form one *instance* of
    ``instance_size = tp*dp_per_instance`` consecutive global ranks; ``world/instance_size`` instances.
  * Inside an instance, vLLM flattens TP across DP: the expert-parallel rank of global rank ``g`` is
    ``g % instance_size`` (= ``dp_rank*tp + tp_rank``) and the EP size is ``instance_size``.
  * Expert ownership follows vLLM's ``determine_expert_map``: rank ``r`` owns ``[r*n, (r+1)*n)`` with
    ``n = E // ep``, the last rank also takes the remainder.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from verl_patches.reshard.errors import InvalidLayoutError

AXES = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def _require_positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise InvalidLayoutError("positive_size", f"{name} must be a positive integer, got {value!r}")


def _strides(sizes: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for s in sizes:
        out.append(acc)
        acc *= s
    return out


def masked_rank_groups(sizes: Sequence[int], mask: Sequence[bool]) -> list[list[int]]:
    """Groups of ranks varying exactly the masked axes (first axis fastest, first masked axis fastest)."""
    strides = _strides(sizes)
    masked = [(s, d) for s, d, m in zip(sizes, strides, mask) if m]
    unmasked = [(s, d) for s, d, m in zip(sizes, strides, mask) if not m]

    def offsets(axes: list[tuple[int, int]]) -> list[int]:
        # itertools.product varies its last argument fastest, so feed the axes reversed.
        ranges = [range(s) for s, _ in reversed(axes)]
        steps = [d for _, d in reversed(axes)]
        return [sum(i * d for i, d in zip(idx, steps)) for idx in itertools.product(*ranges)]

    members = offsets(masked)
    return [[base + m for m in members] for base in offsets(unmasked)]


@dataclass(frozen=True)
class RankCoords:
    """Parallel indices of one training rank (``dp`` is the full data-parallel rank)."""

    rank: int
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int


@dataclass(frozen=True)
class MegatronLayout:
    """The training rank layout: sizes plus the Megatron order string."""

    world_size: int
    tp: int
    pp: int
    ep: int = 1
    cp: int = 1
    order: str = DEFAULT_ORDER
    _tokens: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _require_positive(world_size=self.world_size, tp=self.tp, pp=self.pp, ep=self.ep, cp=self.cp)
        model = self.tp * self.pp * self.cp
        if self.world_size % model:
            raise InvalidLayoutError(
                "world_divisible_by_tp_pp_cp",
                f"world size {self.world_size} is not divisible by tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = {model}",
            )
        dp = self.world_size // model
        if dp % self.ep:
            raise InvalidLayoutError(
                "dp_divisible_by_ep", f"data-parallel size {dp} is not divisible by expert-parallel size {self.ep}"
            )
        tokens = [t for t in self.order.lower().split("-") if t]
        unknown = [t for t in tokens if t not in AXES]
        if unknown or len(set(tokens)) != len(tokens):
            raise InvalidLayoutError("order_tokens", f"order {self.order!r} must list distinct axes among {AXES}")
        if "ep" in tokens and ("dp" not in tokens or abs(tokens.index("ep") - tokens.index("dp")) != 1):
            raise InvalidLayoutError("ep_adjacent_to_dp", f"ep and dp must be adjacent in order {self.order!r}")
        sizes = {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": dp, "pp": self.pp}
        for name in AXES:
            if name not in tokens:
                if sizes[name] != 1:
                    raise InvalidLayoutError(
                        "order_names_every_axis",
                        f"{name} has size {sizes[name]} but order {self.order!r} does not name it",
                    )
                tokens.append(name)
        object.__setattr__(self, "_tokens", tuple(tokens))

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    def _axes(self, independent_ep: bool) -> list[tuple[str, int]]:
        out = []
        for t in self._tokens:
            if t == "ep":
                if independent_ep:
                    out.append(("ep", self.ep))
            elif t == "dp":
                out.append(("dp", self.dp // self.ep if independent_ep else self.dp))
            else:
                out.append((t, getattr(self, t)))
        return out

    def rank_groups(self, token: str, independent_ep: bool = False) -> list[list[int]]:
        """Same result as megatron.core ``RankGenerator.get_ranks(token, independent_ep)``."""
        axes = self._axes(independent_ep)
        names = [n for n, _ in axes]
        wanted = token.lower().split("-")
        missing = [w for w in wanted if w not in names]
        if missing:
            raise InvalidLayoutError(
                "group_token", f"token {token!r} names axes {missing} absent from {'-'.join(names)}"
            )
        return masked_rank_groups([s for _, s in axes], [n in wanted for n in names])

    @cached_property
    def _coords(self) -> tuple[RankCoords, ...]:
        def decompose(axes: list[tuple[str, int]], rank: int) -> dict[str, int]:
            idx, acc = {}, 1
            for name, size in axes:
                idx[name] = (rank // acc) % size
                acc *= size
            return idx

        out = []
        for r in range(self.world_size):
            with_ep = decompose(self._axes(True), r)
            without_ep = decompose(self._axes(False), r)
            out.append(
                RankCoords(
                    rank=r,
                    tp=without_ep["tp"],
                    cp=without_ep["cp"],
                    ep=with_ep["ep"],
                    dp=without_ep["dp"],
                    pp=without_ep["pp"],
                )
            )
        return tuple(out)

    def coords(self, rank: int) -> RankCoords:
        self._check_rank(rank)
        return self._coords[rank]

    def dp_rank(self, rank: int) -> int:
        return self.coords(rank).dp

    def pp_rank(self, rank: int) -> int:
        return self.coords(rank).pp

    @property
    def tp_ep_size(self) -> int:
        """Width over which TP-extend-EP spreads the routed experts."""
        return self.tp * self.ep

    def expert_block(self, rank: int) -> int:
        """Which ``E_local``-sized block of routed experts this rank holds under TP-extend-EP."""
        c = self.coords(rank)
        return c.ep * self.tp + c.tp

    def local_experts(self, num_experts: int) -> int:
        if num_experts % self.tp_ep_size:
            raise InvalidLayoutError(
                "experts_divisible_by_training_tp_ep",
                f"num_experts {num_experts} is not divisible by training tp*ep = {self.tp_ep_size}",
            )
        return num_experts // self.tp_ep_size

    def experts_of_rank(self, rank: int, num_experts: int) -> range:
        n = self.local_experts(num_experts)
        b = self.expert_block(rank)
        return range(b * n, (b + 1) * n)

    @cached_property
    def _tp_ep_group_of(self) -> tuple[tuple[int, ...], ...]:
        groups: list[tuple[int, ...]] = [()] * self.world_size
        for g in self.rank_groups("tp-ep", independent_ep=True):
            for r in g:
                groups[r] = tuple(g)
        return tuple(groups)

    def tp_ep_group(self, rank: int) -> tuple[int, ...]:
        self._check_rank(rank)
        return self._tp_ep_group_of[rank]

    def stage_ranks(self, stage: int) -> list[int]:
        if not 0 <= stage < self.pp:
            raise InvalidLayoutError("pp_stage_in_range", f"stage {stage} not in [0, {self.pp})")
        return [c.rank for c in self._coords if c.pp == stage]

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise InvalidLayoutError("rank_in_range", f"rank {rank} not in [0, {self.world_size})")


@dataclass(frozen=True)
class RolloutLayout:
    """vLLM rollout layout: ``tp`` ranks per engine, ``dp_per_instance`` engines per EP instance."""

    world_size: int
    tp: int
    dp_per_instance: int

    def __post_init__(self) -> None:
        _require_positive(world_size=self.world_size, tp=self.tp, dp_per_instance=self.dp_per_instance)
        if self.world_size % self.instance_size:
            raise InvalidLayoutError(
                "world_divisible_by_rollout_instance",
                f"world size {self.world_size} is not divisible by the rollout instance size "
                f"tp*dp = {self.tp}*{self.dp_per_instance} = {self.instance_size}",
            )

    @property
    def instance_size(self) -> int:
        return self.tp * self.dp_per_instance

    @property
    def ep_size(self) -> int:
        return self.instance_size

    @property
    def num_instances(self) -> int:
        return self.world_size // self.instance_size

    def instance_of(self, rank: int) -> int:
        return rank // self.instance_size

    def ep_rank(self, rank: int) -> int:
        return rank % self.instance_size

    def instance_ranks(self, instance: int) -> range:
        return range(instance * self.instance_size, (instance + 1) * self.instance_size)

    def owned_experts(self, rank: int, num_experts: int) -> range:
        """Experts the rollout rank serves (vLLM ``determine_expert_map``: remainder to the last rank)."""
        ep, r = self.ep_size, self.ep_rank(rank)
        if num_experts < ep:
            raise InvalidLayoutError(
                "rollout_ep_at_most_num_experts",
                f"rollout expert-parallel size {ep} exceeds num_experts {num_experts}: some rollout "
                f"ranks would own no expert",
            )
        n = num_experts // ep
        if r < ep - 1:
            return range(r * n, (r + 1) * n)
        return range(r * n, num_experts)


def production_training_layout() -> MegatronLayout:
    """TP4·PP8·EP8 over 256 dies, order tp-cp-ep-dp-pp (vendor section 1)."""
    return MegatronLayout(world_size=256, tp=4, pp=8, ep=8)


def production_rollout_layout(vllm_dp_size: int) -> RolloutLayout:
    """TP2 with ``VLLM_DP_SIZE`` 128 (one instance, EP256) or 64 (two instances, EP128)."""
    return RolloutLayout(world_size=256, tp=2, dp_per_instance=vllm_dp_size)
