"""Expert routing planner (vendor item E2): grouped-GEMM experts, training TP-extend-EP → vLLM EP.

Tensor layout conventions (shared with the weight converter in ``verl_patches/weights``):

* Training, per rank and MoE layer, under TP-extend-EP the rank holds whole experts
  ``[b*E_local, (b+1)*E_local)`` of its expert block ``b`` (see `layout.MegatronLayout.expert_block`).
  - ``weight1`` parameter: shape ``[hidden, E_local*2*ffn]``; its memory is ``[E_local, hidden, 2*ffn]``
    (Megatron's GroupedMLP does ``weight1.view(E_local, hidden, -1)``). Per expert ``[hidden, 2*ffn]``:
    columns ``[:ffn]`` are gate, ``[ffn:]`` are up (gate‖up).
  - ``weight2`` parameter: shape ``[E_local*ffn, hidden]``; memory ``[E_local, ffn, hidden]``
    (``weight2.view(E_local, -1, hidden)``). Per expert ``[ffn, hidden]``.
  So an expert is one contiguous block of memory in both weights: the *unit* of this planner is one
  expert, along dim 0 of ``weight.view(E_local, *expert_shape)``, and a run of consecutive local experts
  is a zero-copy slice.
* Rollout (vLLM, HF names): per expert ``gate_proj`` and ``up_proj`` are ``[ffn, hidden]``,
  ``down_proj`` is ``[hidden, ffn]``. The receiver turns each received ``[hidden, 2*ffn]`` block into
  ``gate = w[:, :ffn].T`` and ``up = w[:, ffn:].T``, and each ``[ffn, hidden]`` block into
  ``down = w.T`` — strided views, no copy (vLLM's loader copies into its own parameters). Senders never
  transpose.

Routing. Rollout rank ``g`` needs the experts vLLM assigns it (`RolloutLayout.owned_experts`). Each
needed run is split at training expert-block boundaries and every piece is fetched once from one
*holder* of that block:

* ``holder_stage=s`` (default use): only the training ranks of pipeline stage ``s`` - the stage that owns
  the layer - hold it, as they do right after the update. No pipeline broadcast of expert weights is
  needed: receivers on every stage get their experts straight from the owning stage (world group).
* ``holder_stage=None``: every stage holds the layer (the vendor's state after its PP broadcast).

Source choice: a receiver that holds a piece itself takes it locally (a view, no traffic). Otherwise
policy ``"balanced"`` picks the least-loaded holder (ties: same TP×EP group, then lowest rank), so no
sender carries more than the pigeonhole bound; policy ``"tp_ep_group"`` takes the holder inside the
receiver's own TP×EP group (the vendor's routing, valid with ``holder_stage=None``), so the collective can
run on the TP×EP group.

Rounds: ``"per_instance"`` (default) runs one collective per rollout instance, so that with two
instances an expert sent twice by the same holder never needs a packed send buffer; ``"single"`` uses one
collective for all instances.

Unlike the vendor's routing, nothing here requires rollout EP to be a multiple of training TP×EP or
training groups to be consecutive global ranks; `check_vendor_alltoallv_constraints` states the vendor's
conditions for the cost model's comparison row.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Literal

from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.exchange import RankExchange, Slot
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout

SourcePolicy = Literal["balanced", "tp_ep_group"]
RoundPolicy = Literal["per_instance", "single"]


class ExpertWeight(str, Enum):
    WEIGHT1 = "weight1"  # gate‖up, [hidden, 2*ffn] per expert
    WEIGHT2 = "weight2"  # down, [ffn, hidden] per expert


@dataclass(frozen=True)
class ExpertDims:
    hidden: int
    ffn: int

    def expert_shape(self, kind: ExpertWeight) -> tuple[int, int]:
        """Shape of one expert in training memory order."""
        kind = ExpertWeight(kind)
        return (self.hidden, 2 * self.ffn) if kind is ExpertWeight.WEIGHT1 else (self.ffn, self.hidden)

    def expert_numel(self, kind: ExpertWeight) -> int:
        a, b = self.expert_shape(kind)
        return a * b

    def training_param_shape(self, kind: ExpertWeight, local_experts: int) -> tuple[int, int]:
        """Shape of the Megatron grouped-GEMM parameter on one rank."""
        kind = ExpertWeight(kind)
        if kind is ExpertWeight.WEIGHT1:
            return (self.hidden, local_experts * 2 * self.ffn)
        return (local_experts * self.ffn, self.hidden)


@dataclass(frozen=True)
class ExpertTransfer:
    """``count`` experts from ``first_expert`` on, from training rank ``src`` to rollout rank ``dst``."""

    src: int
    dst: int
    first_expert: int
    count: int
    round: int


@dataclass(frozen=True)
class ExpertReshardPlan:
    training: MegatronLayout
    rollout: RolloutLayout
    num_experts: int
    holder_stage: int | None
    source_policy: str
    round_policy: str
    transfers: tuple[ExpertTransfer, ...]
    num_rounds: int

    def held(self, rank: int) -> range:
        """Experts this training rank holds for the layer (empty on a non-owning stage)."""
        if self.holder_stage is not None and self.training.pp_rank(rank) != self.holder_stage:
            return range(0)
        return self.training.experts_of_rank(rank, self.num_experts)

    def needed(self, rank: int) -> range:
        return self.rollout.owned_experts(rank, self.num_experts)

    def round_of(self, rank: int) -> int:
        return self.rollout.instance_of(rank) if self.round_policy == "per_instance" else 0

    @cached_property
    def _by_round_rank(self) -> dict[tuple[int, int], tuple[list[ExpertTransfer], list[ExpertTransfer]]]:
        index: dict[tuple[int, int], tuple[list[ExpertTransfer], list[ExpertTransfer]]] = defaultdict(lambda: ([], []))
        for t in self.transfers:
            index[(t.round, t.src)][0].append(t)
            index[(t.round, t.dst)][1].append(t)
        return dict(index)

    def rank_exchange(self, rank: int, round: int) -> RankExchange:
        """This rank's sends/receives in collective ``round`` (units: experts)."""
        outgoing, incoming = self._by_round_rank.get((round, rank), ([], []))
        held, need = self.held(rank), self.needed(rank)
        sends = sorted(
            (Slot(t.dst, t.first_expert - held.start, t.count) for t in outgoing if t.dst != rank), key=lambda s: s.peer
        )
        recvs = sorted(
            (Slot(t.src, t.first_expert - need.start, t.count) for t in incoming if t.src != rank), key=lambda s: s.peer
        )
        own = [t for t in outgoing if t.dst == rank]
        if own:
            (t,) = own
            return RankExchange(
                rank, tuple(sends), tuple(recvs), t.first_expert - held.start, t.first_expert - need.start, t.count
            )
        return RankExchange(rank, tuple(sends), tuple(recvs))

    def exchanges(self, round: int) -> list[RankExchange]:
        return [self.rank_exchange(r, round) for r in range(self.training.world_size)]

    def received_from(self, rank: int) -> list[ExpertTransfer]:
        """Every piece rollout rank ``rank`` ends with, in expert order (self pieces included)."""
        return sorted((t for t in self.transfers if t.dst == rank), key=lambda t: t.first_expert)


def _holders(training: MegatronLayout, holder_stage: int | None) -> list[int]:
    if holder_stage is None:
        return list(range(training.world_size))
    return training.stage_ranks(holder_stage)


def plan_expert_reshard(
    training: MegatronLayout,
    rollout: RolloutLayout,
    num_experts: int,
    holder_stage: int | None,
    source_policy: SourcePolicy = "balanced",
    round_policy: RoundPolicy = "per_instance",
) -> ExpertReshardPlan:
    """Route every expert each rollout rank needs from one holder, for one MoE layer."""
    if training.world_size != rollout.world_size:
        raise InvalidLayoutError(
            "same_world_size",
            f"training world size {training.world_size} differs from rollout world size "
            f"{rollout.world_size}: both phases must run on the same ranks",
        )
    if source_policy not in ("balanced", "tp_ep_group"):
        raise InvalidLayoutError("source_policy", f"unknown source policy {source_policy!r}")
    if round_policy not in ("per_instance", "single"):
        raise InvalidLayoutError("round_policy", f"unknown round policy {round_policy!r}")
    if source_policy == "tp_ep_group" and holder_stage is not None and training.pp > 1:
        raise InvalidLayoutError(
            "tp_ep_group_needs_every_stage",
            "source policy 'tp_ep_group' needs every stage to hold the layer (holder_stage=None, i.e. "
            "after a PP broadcast): a receiver's own TP×EP group on another stage does not hold it",
        )
    n_local = training.local_experts(num_experts)
    rollout.owned_experts(rollout.ep_size - 1, num_experts)  # validates rollout EP against E

    holders_by_block: dict[int, list[int]] = defaultdict(list)
    for r in _holders(training, holder_stage):
        holders_by_block[training.expert_block(r)].append(r)

    if round_policy == "per_instance":
        rounds = [list(rollout.instance_ranks(i)) for i in range(rollout.num_instances)]
    else:
        rounds = [list(range(rollout.world_size))]

    load = [0] * training.world_size
    transfers: list[ExpertTransfer] = []
    for rnd, receivers in enumerate(rounds):
        for g in receivers:
            need = rollout.owned_experts(g, num_experts)
            group = set(training.tp_ep_group(g))
            e = need.start
            while e < need.stop:
                block = e // n_local
                stop = min(need.stop, (block + 1) * n_local)
                candidates = holders_by_block[block]
                if source_policy == "tp_ep_group":
                    candidates = [h for h in candidates if h in group]
                if g in candidates:
                    src = g
                else:
                    src = min(candidates, key=lambda h: (load[h], h not in group, h))
                    load[src] += stop - e
                transfers.append(ExpertTransfer(src, g, e, stop - e, rnd))
                e = stop
    return ExpertReshardPlan(
        training, rollout, num_experts, holder_stage, source_policy, round_policy, tuple(transfers), len(rounds)
    )


def check_vendor_alltoallv_constraints(training: MegatronLayout, rollout: RolloutLayout, num_experts: int) -> None:
    """The conditions the vendor's all-to-all-v routing needs (ours does not); raises if one fails."""
    t, r = training.tp_ep_size, rollout.ep_size
    training.local_experts(num_experts)
    if num_experts % r:
        raise InvalidLayoutError(
            "experts_divisible_by_rollout_ep", f"num_experts {num_experts} is not divisible by rollout EP {r}"
        )
    if r % t:
        raise InvalidLayoutError(
            "rollout_ep_multiple_of_training_ep", f"rollout EP {r} is not a multiple of training TP×EP {t}"
        )
    for group in training.rank_groups("tp-ep", independent_ep=True):
        if group != list(range(group[0], group[0] + len(group))):
            raise InvalidLayoutError(
                "training_tp_ep_groups_consecutive",
                f"training TP×EP group {group} is not a run of consecutive global ranks (order {training.order!r})",
            )
