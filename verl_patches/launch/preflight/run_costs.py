"""What checkpointing and validation cost on A3, from the model config and the vendor's step table.

The cadences of the A3 profiles (``trainer.save_freq``, ``trainer.test_freq``) are judged against these
figures, and the dry run prints them, so the numbers live in one place:

* one checkpoint step: every parameter of the actor as bf16 weights (2 bytes) plus the distributed optimizer's
  fp32 master weights and Adam moments (4 + 4 + 4 bytes), counted from the HF ``config.json`` with the memory
  model's parameter count (`memory_estimate.total_params`); the reference model, the RNG states and the
  dataloader position are not counted (the reference is not saved, the rest is kilobytes);
* the room a checkpoint folder needs: the steps kept (``trainer.max_actor_ckpt_to_keep``) plus the one being
  written, because a save commits before it prunes the oldest (`checkpoint.commit.prune`);
* the vendor's step timings (reference §2, "Step breakdown"), marked as the vendor's;
* what a save blocks the step for (`SaveTiming`). In the foreground: the whole write, one step's bytes over the
  storage's write bandwidth (an assumption: `STORAGE_WRITE_BYTES_PER_S`). In the background
  (``overlay.async_checkpoint``, issue 42): the snapshot the save call takes (the dense optimizer state's DP
  gather onto DP rank 0 over gloo, an assumed `GATHER_BYTES_PER_S`; the offloaded weights and the swap
  optimizer's state are read where they live on the host, no copy), plus, at the fence before the next update,
  whatever of the write the next step's rollout, weight switch, reward, advantage and reference phases (the
  vendor's times) did not cover;
* the host memory a background write holds on the busiest node (`background_save_host_bytes`) beside what the
  offloaded state holds between phases anyway (`offloaded_host_bytes`), from the memory model's per-rank
  parameter counts and Megatron's rank order (tp-cp-ep-dp-pp: pipeline stages outermost, a dense DP group's
  ranks ``TP x CP`` apart, its rank 0 the first ``TP x CP`` ranks of each stage).

Pure arithmetic: nothing here reads a file or the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from verl_patches.launch.preflight.memory_estimate import (
    ADAM_BYTES_PER_PARAM,
    BF16,
    ParamCount,
    total_params,
)
from verl_patches.reshard.model_dims import ModelDims

CHECKPOINT_BYTES_PER_PARAM = BF16 + ADAM_BYTES_PER_PARAM  # bf16 weights 2 + fp32 master 4 + Adam m 4 + v 4
CHECKPOINT_BYTES_NOTE = (
    f"{CHECKPOINT_BYTES_PER_PARAM} bytes: bf16 weights 2 + fp32 master weights 4 + Adam moments 4 + 4"
)
VENDOR_SOURCE = "the vendor's step table, reference §2"
# assumption: the shared storage takes a save at this aggregate rate (bytes/s); README's planning figure
STORAGE_WRITE_BYTES_PER_S = 10e9
# assumption: a dense DP group's rank 0 gathers the group's optimizer state over gloo (the host network, plus the
# copies Megatron's gather makes) at this rate (bytes/s); the snapshot's only transfer on A3
GATHER_BYTES_PER_S = 1e9


@dataclass(frozen=True)
class CheckpointStep:
    """The size of one saved step of the actor."""

    params: int

    @property
    def nbytes(self) -> int:
        return self.params * CHECKPOINT_BYTES_PER_PARAM


def checkpoint_step(model: Mapping[str, Any]) -> CheckpointStep:
    """One checkpoint step of the model a HF ``config.json`` dict describes (671.0 B parameters, 9.39 TB for
    DeepSeek-V3 without MTP)."""
    return CheckpointStep(total_params(ModelDims.from_hf_config(model)))


def saves_in_run(save_freq: int, total_steps: int | None) -> int | None:
    """Steps a run of ``total_steps`` saves (verl: every ``save_freq`` steps and the last); None when the run's
    length is not in the config (it follows from the data)."""
    if save_freq <= 0:
        return 0
    if total_steps is None or total_steps <= 0:
        return None
    return total_steps // save_freq + (1 if total_steps % save_freq else 0)


def room_needed(step_bytes: int, keep: int | None, existing_steps: int, saves: int | None = None) -> int:
    """Free bytes the next saves need: ``keep`` steps plus the one being written, less the steps already there,
    and never more steps than the run saves (``saves``, when known).

    ``keep`` None or <= 0 means every step is kept (verl's default): then each save needs one more step of
    room and the folder fills up; that is reported by the caller, and one step is what is needed now."""
    steps = 1 if not keep or keep <= 0 else max(0, keep + 1 - min(max(existing_steps, 0), keep))
    if saves is not None:
        steps = min(steps, saves)
    return steps * step_bytes


@dataclass(frozen=True)
class VendorStep:
    """One step of the vendor's run as its step table gives it (seconds)."""

    step_s: float
    rollout_s: float  # generation, without the train -> rollout weight switch
    switch_s: float  # the weight switch (reshard + offload)
    what: str
    ref_s: float = 0.0  # the reference's log-prob pass ("ref prefill")
    reward_s: float = 0.0
    adv_s: float = 0.0

    @property
    def validation_s(self) -> float:
        """A validation is one more generate (of fewer prompts than a training rollout, one response each,
        in the same number of decode steps at most) with its weight switch: one rollout phase bounds it."""
        return self.rollout_s + self.switch_s

    @property
    def before_update_s(self) -> float:
        """The step's work before its update: what a background write overlaps before the fence."""
        return self.rollout_s + self.switch_s + self.reward_s + self.adv_s + self.ref_s


VENDOR_STEPS: dict[str, VendorStep] = {
    "a3-256die-true-weight": VendorStep(
        859.68, 373.65, 17.0, "true weight, deepscaler, step 2", ref_s=144.5, reward_s=5.0, adv_s=0.21
    ),
    "a3-256die-random-init": VendorStep(
        796.8, 318.27, 35.63, "random init, gsm8k, step 5", ref_s=104.7, reward_s=13.7, adv_s=0.188
    ),
}


def vendor_step(profile: str | None) -> VendorStep | None:
    """The vendor's figures for an A3 profile (``overlay.profile``), None for a layout the vendor did not run."""
    return VENDOR_STEPS.get(profile or "")


@dataclass(frozen=True)
class SaveTiming:
    """Seconds one save stops the step for, in the foreground and in the background (module docstring)."""

    write_s: float  # the whole write: one step's bytes over the storage's bandwidth
    snapshot_s: float  # the background save's call: its snapshot
    window_s: float  # the next step's work before its update, which the background write overlaps

    @property
    def foreground_s(self) -> float:
        return self.write_s

    @property
    def fence_s(self) -> float:
        """What the fence before the next update still waits for."""
        return max(0.0, self.write_s - self.window_s)

    @property
    def background_s(self) -> float:
        return self.snapshot_s + self.fence_s


def save_timing(
    step_bytes: int,
    gather_bytes: int,
    window_s: float,
    storage_bps: float = STORAGE_WRITE_BYTES_PER_S,
    gather_bps: float = GATHER_BYTES_PER_S,
) -> SaveTiming:
    """`SaveTiming` of a step of ``step_bytes`` whose snapshot gathers ``gather_bytes`` onto one rank (the
    busiest DP rank 0), with ``window_s`` of work before the next update."""
    return SaveTiming(step_bytes / storage_bps, gather_bytes / gather_bps, window_s)


def hidden_bandwidth(step_bytes: int, window_s: float) -> float:
    """The storage bandwidth (bytes/s) at which a background write ends within the window: no wait at the fence."""
    return step_bytes / window_s if window_s > 0 else float("inf")


@dataclass(frozen=True)
class RankLayout:
    """How Megatron places the training ranks (order tp-cp-ep-dp-pp) and what each stage holds."""

    tp: int
    cp: int
    dp: int  # the dense data-parallel size (EP included)
    expert_dp: int  # the experts' data-parallel size (DP / EP with TP-extend-EP)
    ranks_per_node: int
    stage_params: tuple[ParamCount, ...]  # per pipeline stage, one rank's parameters (memory model)

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * len(self.stage_params)

    def stage_of(self, rank: int) -> int:
        return rank // (self.tp * self.cp * self.dp)

    def dense_dp_zero(self, rank: int) -> bool:
        """Rank 0 of its dense DP group: the first TP x CP ranks of each stage."""
        return rank % (self.tp * self.cp * self.dp) < self.tp * self.cp


def _dp_state(count: int, dp: int) -> float:
    return ADAM_BYTES_PER_PARAM * count / max(dp, 1)


def background_save_rank_bytes(layout: RankLayout, rank: int, swap_optimizer: bool) -> float:
    """Host bytes one rank's background write holds beyond the run's own state, while it writes:

    * the weights: their host copy (offloaded: the buffer verl's next offload replaces, kept alive by the write;
      on the device: the snapshot's copy), 2 bytes a parameter either way;
    * a DP group of several ranks: its rank 0 holds the group's gathered optimizer state (12 bytes a parameter);
    * a DP group of one rank: nothing with the swap optimizer (its host buffers are written as they are), a host
      copy of the device-resident state without it."""
    p = layout.stage_params[layout.stage_of(rank)]
    held = BF16 * p.total
    for count, dp, zero in (
        (p.dense, layout.dp, layout.dense_dp_zero(rank)),
        (p.expert, layout.expert_dp, True),  # an upper bound when expert DP > 1: any rank may be its rank 0
    ):
        if dp > 1:
            held += ADAM_BYTES_PER_PARAM * count if zero else 0
        elif not swap_optimizer:
            held += ADAM_BYTES_PER_PARAM * count
    return held


def offloaded_host_bytes(layout: RankLayout, rank: int, param_offload: bool, ref_offload: bool, swap: bool) -> float:
    """Host bytes one rank's offloaded state takes between phases anyway: the actor's and the reference's bf16
    weights when offloaded, the swap optimizer's share of the state."""
    p = layout.stage_params[layout.stage_of(rank)]
    held = BF16 * p.total * (int(param_offload) + int(ref_offload))
    if swap:
        held += _dp_state(p.dense, layout.dp) + _dp_state(p.expert, layout.expert_dp)
    return held


def busiest_node(layout: RankLayout, per_rank: Callable[[int], float]) -> tuple[int, float]:
    """(node index, bytes) of the node whose ranks sum ``per_rank(rank)`` highest."""
    nodes = max(1, layout.world // max(layout.ranks_per_node, 1))
    best = (0, -1.0)
    for node in range(nodes):
        total = sum(per_rank(r) for r in range(node * layout.ranks_per_node, (node + 1) * layout.ranks_per_node))
        if total > best[1]:
            best = (node, total)
    return best


def dense_gather_bytes(layout: RankLayout) -> float:
    """The most optimizer-state bytes one DP rank 0 gathers in the snapshot (0 when DP is 1)."""
    if layout.dp <= 1:
        return 0.0
    return max(ADAM_BYTES_PER_PARAM * p.dense for p in layout.stage_params)


def human_bytes(nbytes: float) -> str:
    """Decimal units, as storage is sold and ``df -H`` shows it."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def human_seconds(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


__all__ = [
    "CHECKPOINT_BYTES_NOTE",
    "CHECKPOINT_BYTES_PER_PARAM",
    "CheckpointStep",
    "GATHER_BYTES_PER_S",
    "RankLayout",
    "STORAGE_WRITE_BYTES_PER_S",
    "SaveTiming",
    "VENDOR_SOURCE",
    "VENDOR_STEPS",
    "VendorStep",
    "background_save_rank_bytes",
    "busiest_node",
    "checkpoint_step",
    "dense_gather_bytes",
    "hidden_bandwidth",
    "human_bytes",
    "human_seconds",
    "offloaded_host_bytes",
    "room_needed",
    "save_timing",
    "saves_in_run",
    "vendor_step",
]
