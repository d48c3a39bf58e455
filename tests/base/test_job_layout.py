"""verl_patches.base.job_layout: the one reading of the job's parallel layout, and its refusals.

The derivation is checked exhaustively against the rules it states (megatron.core's, vLLM's) and against the
independent rank arithmetic of `reshard.layout` (MegatronLayout, RolloutLayout), over every size hypothesis
draws; the config reading over dicts and OmegaConf nodes, every refusal naming its key.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl_patches.base.job_layout import (
    CP_KEY,
    DIES_PER_NODE_KEY,
    EP_KEY,
    NODES_KEY,
    PP_KEY,
    ROLLOUT_TP_KEY,
    SP_KEY,
    STRATEGY_KEY,
    TP_KEY,
    Cluster,
    JobLayout,
    JobLayoutError,
    RolloutParallel,
    TrainingParallel,
    job_layout,
    rollout_engines_of,
    rollout_of,
)
from verl_patches.base.overlay_settings import VLLM_DP_KEY, OverlaySettingError
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout

SIZES = st.sampled_from([1, 2, 3, 4, 5, 6, 8, 12, 16, 32])
WORLDS = st.integers(1, 512)


def a3_keys(**changed: object) -> dict[str, object]:
    keys: dict[str, object] = {
        NODES_KEY: 16,
        DIES_PER_NODE_KEY: 16,
        STRATEGY_KEY: "megatron",
        TP_KEY: 4,
        PP_KEY: 8,
        EP_KEY: 8,
        CP_KEY: 1,
        ROLLOUT_TP_KEY: 2,
        VLLM_DP_KEY: 64,
    }
    keys.update(changed)
    return keys


def cfg_of(keys: dict[str, object]) -> dict:
    out: dict = {}
    for dotted, value in keys.items():
        node = out
        *path, last = dotted.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


# ------------------------------------------------------------------------------------- the derivation


@given(world=WORLDS, tp=SIZES, pp=SIZES, ep=SIZES, cp=SIZES)
def test_training_accepts_exactly_what_megatron_accepts(world: int, tp: int, pp: int, ep: int, cp: int) -> None:
    model = tp * pp * cp
    valid = world % model == 0 and (world // model) % ep == 0
    try:
        got = TrainingParallel(world, tp=tp, pp=pp, ep=ep, cp=cp)
    except JobLayoutError as e:
        assert not valid
        # the key names the size to change: EP when the DP does not take it, else the model-parallel sizes
        if world % model == 0:
            assert e.key == EP_KEY
        else:
            assert set(e.key.split(" / ")) == {k for k, s in ((TP_KEY, tp), (PP_KEY, pp), (CP_KEY, cp)) if s > 1}
        assert str(e).startswith(e.key) and "\n" not in str(e)
        with pytest.raises(InvalidLayoutError):  # the rank arithmetic refuses it too
            MegatronLayout(world_size=world, tp=tp, pp=pp, ep=ep, cp=cp)
        return
    assert valid
    assert got.dp * tp * pp * cp == world and got.dp % ep == 0
    assert got.dp == MegatronLayout(world_size=world, tp=tp, pp=pp, ep=ep, cp=cp).dp


@given(world=WORLDS, tp=SIZES, dp=SIZES)
def test_rollout_instances_are_whole_and_match_vllms_layout(world: int, tp: int, dp: int) -> None:
    try:
        got = RolloutParallel(world, tp=tp, dp_per_instance=dp)
    except JobLayoutError as e:
        assert world % (tp * dp)
        assert e.key == (ROLLOUT_TP_KEY if world % tp else VLLM_DP_KEY)
        assert str(e).startswith(f"{e.key}=") and "\n" not in str(e)
        with pytest.raises(InvalidLayoutError):
            RolloutLayout(world_size=world, tp=tp, dp_per_instance=dp)
        return
    vllm = RolloutLayout(world_size=world, tp=tp, dp_per_instance=dp)
    assert (got.instance_size, got.instances) == (vllm.instance_size, vllm.num_instances)
    assert got.dp == world // tp == got.instances * dp  # engines: per instance x instances
    assert got.instances * got.instance_size == world
    assert got.dp_groups == (got.instances * tp if dp > 1 else 0)


@given(nodes=st.integers(1, 64), per_node=st.integers(1, 16))
def test_the_world_is_every_die_of_every_node(nodes: int, per_node: int) -> None:
    assert Cluster(nodes, per_node).world == nodes * per_node


@pytest.mark.parametrize(
    "make, key",
    [
        (lambda: Cluster(0, 16), NODES_KEY),
        (lambda: Cluster(16, -1), DIES_PER_NODE_KEY),
        (lambda: Cluster(True, 16), NODES_KEY),  # a bool is not a node count
        (lambda: TrainingParallel(8, tp=0), TP_KEY),
        (lambda: TrainingParallel(8, pp="2"), PP_KEY),  # type: ignore[arg-type]
        (lambda: TrainingParallel(8, cp=2.0), CP_KEY),  # type: ignore[arg-type]
        (lambda: TrainingParallel(8, cp=3, strategy="fsdp"), SP_KEY),
        (lambda: TrainingParallel(8, tp=2, strategy="fsdp"), STRATEGY_KEY),
        (lambda: RolloutParallel(8, tp=0), ROLLOUT_TP_KEY),
        (lambda: RolloutParallel(8, dp_per_instance=0), VLLM_DP_KEY),
    ],
)
def test_a_bad_size_is_refused_naming_its_key(make, key: str) -> None:
    with pytest.raises(JobLayoutError) as e:
        make()
    assert e.value.key == key and str(e.value).startswith(key)


def test_the_parts_must_share_the_clusters_world() -> None:
    with pytest.raises(ValueError, match="must be the cluster's 16"):
        JobLayout(Cluster(1, 16), TrainingParallel(16), RolloutParallel(8))


# ------------------------------------------------------------------------------------ the config reading


def test_the_a3_layout_from_a_config() -> None:
    got = job_layout(cfg_of(a3_keys()))
    assert (got.world, got.cluster.nodes, got.cluster.dies_per_node) == (256, 16, 16)
    t = got.training
    assert (t.tp, t.pp, t.ep, t.cp, t.dp, t.is_megatron) == (4, 8, 8, 1, 8, True)
    r = got.rollout
    assert (r.tp, r.dp, r.dp_per_instance, r.instance_size, r.instances, r.dp_groups) == (2, 128, 64, 128, 2, 4)


def test_an_omegaconf_node_reads_as_a_dict() -> None:
    assert job_layout(OmegaConf.create(cfg_of(a3_keys()))) == job_layout(cfg_of(a3_keys()))


def test_absent_sizes_are_upstreams_defaults() -> None:
    """Megatron's EP/CP, the rollout TP and VLLM_DP_SIZE are 1 where the config has no such key or null."""
    keys = a3_keys(**{EP_KEY: None, ROLLOUT_TP_KEY: None})
    del keys[CP_KEY], keys[VLLM_DP_KEY]
    got = job_layout(cfg_of(keys))
    assert (got.training.ep, got.training.cp, got.rollout.tp, got.rollout.dp_per_instance) == (1, 1, 1, 1)
    assert got.rollout.instances == got.rollout.dp == 256 and got.rollout.dp_groups == 0


def test_fsdp_reads_the_sequence_parallel_size_and_no_megatron_key() -> None:
    keys = a3_keys(**{STRATEGY_KEY: "fsdp", TP_KEY: "not read", SP_KEY: 4})
    t = job_layout(cfg_of(keys)).training
    assert (t.tp, t.pp, t.ep, t.cp, t.dp, t.is_megatron) == (1, 1, 1, 4, 64, False)


@pytest.mark.parametrize("key", [NODES_KEY, DIES_PER_NODE_KEY])
def test_a_missing_cluster_key_is_named(key: str) -> None:
    keys = a3_keys()
    del keys[key]
    with pytest.raises(JobLayoutError, match=rf"^{key} is not set") as e:
        job_layout(cfg_of(keys))
    assert e.value.key == key


BAD_VALUES = st.one_of(
    st.booleans(),
    st.integers(max_value=0),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.lists(st.integers(1, 4), max_size=2),
)


@given(
    key=st.sampled_from([NODES_KEY, DIES_PER_NODE_KEY, TP_KEY, PP_KEY, EP_KEY, CP_KEY, ROLLOUT_TP_KEY, VLLM_DP_KEY]),
    value=BAD_VALUES,
)
def test_every_ill_typed_size_is_refused_naming_its_key(key: str, value: object) -> None:
    with pytest.raises((JobLayoutError, OverlaySettingError)) as e:
        job_layout(cfg_of(a3_keys(**{key: value})))
    assert e.value.key == key and str(e.value).startswith(key) and "\n" not in str(e.value)


@given(tp=SIZES, pp=SIZES, ep=SIZES, rollout_tp=SIZES, dp=SIZES, nodes=st.integers(1, 4), per_node=SIZES)
def test_a_config_reads_as_its_parts(tp, pp, ep, rollout_tp, dp, nodes, per_node) -> None:
    """Whatever the sizes, the config gives the layout its parts would, or the same refusal."""
    keys = a3_keys(
        **{NODES_KEY: nodes, DIES_PER_NODE_KEY: per_node, TP_KEY: tp, PP_KEY: pp, EP_KEY: ep},
        **{ROLLOUT_TP_KEY: rollout_tp, VLLM_DP_KEY: dp},
    )
    world = nodes * per_node
    try:
        want = JobLayout(
            Cluster(nodes, per_node),
            TrainingParallel(world, tp=tp, pp=pp, ep=ep),
            RolloutParallel(world, tp=rollout_tp, dp_per_instance=dp),
        )
    except JobLayoutError as e:
        with pytest.raises(JobLayoutError) as got:
            job_layout(cfg_of(keys))
        assert (got.value.key, str(got.value)) == (e.key, str(e))
        return
    assert job_layout(cfg_of(keys)) == want


def test_the_engines_alone_leave_the_instances_to_their_own_check() -> None:
    """`rollout_engines_of` judges the rollout TP only (the dry run reports the instances apart)."""
    keys = a3_keys(**{VLLM_DP_KEY: 96})  # 128 engines do not split into instances of 96
    engines = rollout_engines_of(cfg_of(keys), 256)
    assert (engines.tp, engines.dp, engines.dp_per_instance) == (2, 128, 1)
    with pytest.raises(JobLayoutError) as e:
        rollout_of(cfg_of(keys), 256)
    assert e.value.key == VLLM_DP_KEY
    with pytest.raises(JobLayoutError) as e:
        rollout_engines_of(cfg_of(a3_keys(**{ROLLOUT_TP_KEY: 3})), 256)
    assert e.value.key == ROLLOUT_TP_KEY
