"""verl_patches.trainer.profiles: every run known by name composes, with the project's own composition, into a
config whose layout (`base.job_layout`) and overlay settings (`base.overlay_settings`) read and hold the numbers
the run is for (A3: 256 dies, TP4 x PP8 x EP8 training, two or one vLLM instances of TP2)."""

from __future__ import annotations

import pytest

from verl_patches.base.config_access import get
from verl_patches.base.job_layout import EP_KEY, job_layout
from verl_patches.base.overlay_settings import overlay_settings
from verl_patches.driver.config_checks import check_config
from verl_patches.trainer.config_compose import (
    CONFIG_DIR,
    CONFIG_NAMES,
    ConfigCompositionError,
    compose_config,
    resolved,
)
from verl_patches.trainer.profiles import CLUSTER_PROFILES, PROFILES, TINY_CONFIG, TINY_CONFIGS

# profile -> (nodes, dies per node), (TP, PP, EP, CP, DP), (rollout TP, engines, VLLM_DP_SIZE, instances)
EXPECTED = {
    "a3_256die_true_weight": ((16, 16), (4, 8, 8, 1, 8), (2, 128, 64, 2)),
    "a3_256die_random_init": ((16, 16), (4, 8, 8, 1, 8), (2, 128, 128, 1)),
    "a3_16die_smoke": ((1, 16), (2, 2, 4, 1, 4), (2, 8, 8, 1)),
    "tiny": ((1, 4), (2, 1, 2, 1, 2), (2, 2, 2, 1)),
}


def composed(config_name: str, overrides: tuple[str, ...] = ()):
    return resolved(compose_config(config_name, list(overrides)))


def test_every_profile_names_a_config_and_its_group_file() -> None:
    assert set(EXPECTED) == set(PROFILES)
    for name, p in PROFILES.items():
        assert p.name == name and p.config_name in CONFIG_NAMES
        assert p.group is None or (CONFIG_DIR / "profile" / f"{p.group}.yaml").is_file(), name
        assert p.cluster == (p.group is not None), name  # the A3 runs are the config groups; tiny is local
    assert set(TINY_CONFIGS.values()) <= set(CONFIG_NAMES)
    assert PROFILES["tiny"].config_name == TINY_CONFIGS["megatron"]
    assert CLUSTER_PROFILES == ("a3_256die_true_weight", "a3_256die_random_init", "a3_16die_smoke")


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_each_profile_builds_its_layout(name: str) -> None:
    p = PROFILES[name]
    cfg = composed(p.config_name, p.overrides)
    layout = job_layout(cfg)
    (nodes, per_node), training, rollout = EXPECTED[name]
    assert (layout.cluster.nodes, layout.cluster.dies_per_node, layout.world) == (nodes, per_node, nodes * per_node)
    t = layout.training
    assert (t.tp, t.pp, t.ep, t.cp, t.dp) == training and t.is_megatron
    r = layout.rollout
    assert (r.tp, r.dp, r.dp_per_instance, r.instances) == rollout
    assert r.instance_size == r.world // r.instances  # whole instances of TP x VLLM_DP_SIZE ranks
    # the overlay section reads typed, and its DP size is the layout's
    overlay = overlay_settings(cfg)
    assert overlay.vllm_dp_size == r.dp_per_instance
    assert overlay.profile == ("tiny" if name == "tiny" else name.replace("_", "-"))


@pytest.mark.parametrize("name", CLUSTER_PROFILES)
def test_needs_checkpoint_is_whether_the_profile_loads_converted_weights(name: str) -> None:
    p = PROFILES[name]
    cfg = composed(p.config_name, p.overrides)
    assert p.needs_checkpoint == bool(get(cfg, "actor_rollout_ref.actor.megatron.use_dist_checkpointing"))


def test_the_fsdp_tiny_config_is_one_rank_of_verls_fsdp_actor() -> None:
    layout = job_layout(composed(TINY_CONFIGS["fsdp"]))
    t, r = layout.training, layout.rollout
    assert (layout.world, t.is_megatron, t.tp, t.pp, t.ep, t.cp, t.dp) == (1, False, 1, 1, 1, 1, 1)
    assert (r.tp, r.dp, r.dp_per_instance, r.instances) == (1, 1, 1, 1)


def test_the_composition_refuses_an_overlay_key_that_is_not_ours() -> None:
    with pytest.raises(ConfigCompositionError, match=r"^overlay\.vllm_dp_sise: not an overlay setting; did you mean"):
        composed(TINY_CONFIG, ("+overlay.vllm_dp_sise=4",))
    with pytest.raises(ConfigCompositionError, match=r"^overlay\.async_checkpoint='yes': expected true or false"):
        composed(TINY_CONFIG, ("overlay.async_checkpoint=yes",))


def test_a_layout_that_does_not_hold_is_one_problem_of_the_job_start() -> None:
    """The trainer entry and the fit loop refuse it (`check_config`), naming the key, before any worker starts."""
    cfg = composed(TINY_CONFIG, (f"{EP_KEY}=4",))  # tiny: TP2 x PP1 over 4 ranks leaves DP2
    (problem,) = [p for p in check_config(cfg) if EP_KEY in p]
    assert problem.startswith(f"{EP_KEY}=4 does not divide the training DP 2")
