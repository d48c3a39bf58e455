"""The job's parallel layout, read and checked once from the composed trainer config: `job_layout`.

Every number the launch, the preflight and the driver derive from the cluster shape comes from here: the world
(``trainer.nnodes`` x ``trainer.n_gpus_per_node`` dies), the training engine's TP / PP / EP / CP and the DP
they leave, and the rollout's TP, its engines (verl's rollout DP: one vLLM engine per TP ranks) and its vLLM
instances (``overlay.vllm_dp_size`` engines each: the instance's expert-parallel group, exported as
VLLM_DP_SIZE). tests/ci/test_one_layout.py refuses a second derivation elsewhere.

The checks are those the stack makes at start-up, so a layout built here does not die later:

* megatron.core 0.8 ``initialize_model_parallel``: the world divisible by TP x PP x CP, the DP that leaves
  divisible by EP;
* verl's FSDP actor (a strategy other than ``megatron``): no TP / PP / EP; the Ulysses sequence-parallel size
  plays CP's part (it must divide the world, DP is what is left);
* vLLM (verl's colocated rollout): the rollout TP divides the world, and ``overlay.vllm_dp_size`` divides
  the engines, so every instance of TP x VLLM_DP_SIZE consecutive ranks is whole.

A refusal is a `JobLayoutError`: one line that starts with the config key to change, which ``.key`` holds.
Standard library only (`base`): the config is anything with ``.get`` and ``in`` (an OmegaConf node, a dict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl_patches.base.config_access import get
from verl_patches.base.overlay_settings import VLLM_DP_KEY, overlay_settings

NODES_KEY = "trainer.nnodes"
DIES_PER_NODE_KEY = "trainer.n_gpus_per_node"
STRATEGY_KEY = "actor_rollout_ref.actor.strategy"
MEGATRON = "actor_rollout_ref.actor.megatron"
TP_KEY = f"{MEGATRON}.tensor_model_parallel_size"
PP_KEY = f"{MEGATRON}.pipeline_model_parallel_size"
EP_KEY = f"{MEGATRON}.expert_model_parallel_size"
CP_KEY = f"{MEGATRON}.context_parallel_size"
SP_KEY = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"  # verl's FSDP actor
ROLLOUT_TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
MEGATRON_STRATEGY = "megatron"


class JobLayoutError(ValueError):
    """A parallel layout the stack would refuse. The message is one line starting with the key to change;
    ``key`` is that key (several, joined by " / ", where any of them would do)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _positive(key: str, value: object) -> int:
    """``value`` as a size: an int of at least 1 (a bool, a string or a float is refused, naming ``key``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobLayoutError(key, f"{key}={value!r}: expected a positive integer, got {type(value).__name__}")
    if value < 1:
        raise JobLayoutError(key, f"{key}={value}: expected a positive integer")
    return value


@dataclass(frozen=True)
class Cluster:
    """Where the job runs: ``nodes`` nodes of ``dies_per_node`` NPU dies (GPUs), one rank per die."""

    nodes: int
    dies_per_node: int

    def __post_init__(self) -> None:
        _positive(NODES_KEY, self.nodes)
        _positive(DIES_PER_NODE_KEY, self.dies_per_node)

    @property
    def world(self) -> int:
        """Ranks of the job: every die of every node."""
        return self.nodes * self.dies_per_node


@dataclass(frozen=True)
class TrainingParallel:
    """The training engine's parallel sizes over ``world`` ranks; ``dp`` is what TP x PP x CP leave.

    ``strategy`` is the actor's (``actor_rollout_ref.actor.strategy``): with ``megatron`` the sizes are
    Megatron's; with verl's FSDP actor TP, PP and EP are 1 and ``cp`` is the Ulysses sequence-parallel size."""

    world: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    strategy: str = MEGATRON_STRATEGY
    dp: int = field(init=False)

    def __post_init__(self) -> None:
        _positive("world", self.world)
        for axis in ("tp", "pp", "ep", "cp"):
            _positive(self.key(axis), getattr(self, axis))
        if not self.is_megatron and (self.tp, self.pp, self.ep) != (1, 1, 1):
            raise JobLayoutError(
                STRATEGY_KEY,
                f"{STRATEGY_KEY}={self.strategy}: verl's FSDP actor has no TP, PP or EP "
                f"(got TP{self.tp} PP{self.pp} EP{self.ep})",
            )
        model = self.tp * self.pp * self.cp
        if self.world % model:
            keys = " / ".join(self.key(a) for a in ("tp", "pp", "cp") if getattr(self, a) > 1)
            raise JobLayoutError(
                keys,
                f"{keys}: TP{self.tp} x PP{self.pp} x CP{self.cp} = {model} does not divide the world of "
                f"{self.world} ranks (megatron.core's initialize_model_parallel refuses it)",
            )
        dp = self.world // model
        if dp % self.ep:
            raise JobLayoutError(
                EP_KEY,
                f"{EP_KEY}={self.ep} does not divide the training DP {dp} (world {self.world} / TP{self.tp} x "
                f"PP{self.pp} x CP{self.cp}; megatron.core's initialize_model_parallel refuses it)",
            )
        object.__setattr__(self, "dp", dp)

    @property
    def is_megatron(self) -> bool:
        return self.strategy == MEGATRON_STRATEGY

    def key(self, axis: str) -> str:
        """The config key of one axis's size (``tp``, ``pp``, ``ep``, ``cp``) under this strategy."""
        if axis == "cp" and not self.is_megatron:
            return SP_KEY
        return {"tp": TP_KEY, "pp": PP_KEY, "ep": EP_KEY, "cp": CP_KEY}[axis]


@dataclass(frozen=True)
class RolloutParallel:
    """The rollout over ``world`` ranks: engines of ``tp`` ranks, grouped into vLLM instances of
    ``dp_per_instance`` engines (VLLM_DP_SIZE), each instance one expert-parallel group of consecutive ranks."""

    world: int
    tp: int = 1
    dp_per_instance: int = 1

    def __post_init__(self) -> None:
        _positive("world", self.world)
        _positive(ROLLOUT_TP_KEY, self.tp)
        _positive(VLLM_DP_KEY, self.dp_per_instance)
        if self.world % self.tp:
            raise JobLayoutError(
                ROLLOUT_TP_KEY,
                f"{ROLLOUT_TP_KEY}={self.tp} does not divide the world of {self.world} ranks "
                f"(verl builds one rollout engine per TP ranks)",
            )
        if self.dp % self.dp_per_instance:
            raise JobLayoutError(
                VLLM_DP_KEY,
                f"{VLLM_DP_KEY}={self.dp_per_instance} does not divide the {self.dp} rollout engines "
                f"(world {self.world} / rollout TP{self.tp}): a vLLM instance is TP x VLLM_DP_SIZE whole ranks",
            )

    @property
    def dp(self) -> int:
        """Rollout engines over the job (verl's rollout data-parallel size): the world / rollout TP."""
        return self.world // self.tp

    @property
    def instance_size(self) -> int:
        """Ranks of one vLLM instance: TP x VLLM_DP_SIZE; also the instance's expert-parallel size."""
        return self.tp * self.dp_per_instance

    @property
    def instances(self) -> int:
        return self.world // self.instance_size

    @property
    def dp_groups(self) -> int:
        """vLLM DP groups over the job (one per instance and TP rank), each with its own master port; none
        where an instance is one engine (VLLM_DP_SIZE 1: no DP group forms)."""
        return self.instances * self.tp if self.dp_per_instance > 1 else 0


@dataclass(frozen=True)
class JobLayout:
    """The job's cluster, training and rollout parallel layout (`job_layout` builds it from a config)."""

    cluster: Cluster
    training: TrainingParallel
    rollout: RolloutParallel

    def __post_init__(self) -> None:
        world = self.cluster.world
        if self.training.world != world or self.rollout.world != world:
            raise ValueError(
                f"training world {self.training.world} and rollout world {self.rollout.world} must be the "
                f"cluster's {world}"
            )

    @property
    def world(self) -> int:
        return self.cluster.world


def _size(cfg: Any, key: str) -> int:
    """A size from the config; 1 where the key is absent or null (verl's and Megatron's default)."""
    value = get(cfg, key)
    return 1 if value is None else _positive(key, value)


def cluster_of(cfg: Any) -> Cluster:
    """The cluster shape; both keys must be set (verl's configs always set them)."""
    nodes, per_node = get(cfg, NODES_KEY), get(cfg, DIES_PER_NODE_KEY)
    for key, value in ((NODES_KEY, nodes), (DIES_PER_NODE_KEY, per_node)):
        if value is None:
            raise JobLayoutError(key, f"{key} is not set: the job's cluster shape needs it")
    return Cluster(nodes, per_node)


def training_of(cfg: Any, world: int) -> TrainingParallel:
    """The training engine's layout over ``world`` ranks, by the actor's strategy."""
    strategy = get(cfg, STRATEGY_KEY, MEGATRON_STRATEGY)
    if strategy != MEGATRON_STRATEGY:
        return TrainingParallel(world, cp=_size(cfg, SP_KEY), strategy=str(strategy))
    return TrainingParallel(
        world, tp=_size(cfg, TP_KEY), pp=_size(cfg, PP_KEY), ep=_size(cfg, EP_KEY), cp=_size(cfg, CP_KEY)
    )


def rollout_engines_of(cfg: Any, world: int) -> RolloutParallel:
    """The rollout's engines over ``world`` ranks, each its own instance: for a reader that judges the rollout TP
    apart from the instances (the dry run reports each with its own check)."""
    return RolloutParallel(world, tp=_size(cfg, ROLLOUT_TP_KEY))


def rollout_of(cfg: Any, world: int) -> RolloutParallel:
    """The rollout's layout over ``world`` ranks; one engine per instance where ``overlay.vllm_dp_size`` is
    not set (what the launch exports then: VLLM_DP_SIZE 1)."""
    engines = rollout_engines_of(cfg, world)
    dp = overlay_settings(cfg).vllm_dp_size
    return RolloutParallel(world, tp=engines.tp, dp_per_instance=1 if dp is None else dp)


def job_layout(cfg: Any) -> JobLayout:
    """The one reading of the job's layout from a composed config; `JobLayoutError` names the key at fault."""
    cluster = cluster_of(cfg)
    return JobLayout(cluster, training_of(cfg, cluster.world), rollout_of(cfg, cluster.world))
