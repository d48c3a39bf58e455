"""F4 is installed only where the profile enables KV-NZ: the launcher's flag comes from the composed config,
and an engine whose config and flag disagree is refused at build, naming the key and the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_patches.rollout.engine_factory import EngineArgumentError, rollout_llm_kwargs
from verl_patches.rollout.kv_nz_switch import GRAPH_CONFIG_KEY, kv_nz_env, kv_nz_wanted
from verl_patches.worker_calls.env_names import KV_NZ_FLAG

ROOT = Path(__file__).resolve().parents[2]


def graph(enabled: bool, nz: bool) -> dict:
    return {"enabled": enabled, "enable_kv_nz": nz, "graph_batch_sizes": [8]}


@pytest.mark.parametrize(
    "enabled, nz, want", [(True, True, True), (True, False, False), (False, True, False), (False, False, False)]
)
def test_kv_nz_needs_graph_mode_and_the_nz_cache(enabled, nz, want) -> None:
    assert kv_nz_wanted(graph(enabled, nz)) is want
    cfg = {
        "actor_rollout_ref": {
            "rollout": {"engine_kwargs": {"vllm": {"additional_config": {"torchair_graph_config": graph(enabled, nz)}}}}
        }
    }
    assert kv_nz_env(cfg) == {KV_NZ_FLAG: "1" if want else "0"}
    assert kv_nz_env({}) == {KV_NZ_FLAG: "0"} and kv_nz_wanted(None) is False


@pytest.mark.parametrize("profile", ["a3_256die_true_weight", "a3_256die_random_init", "a3_16die_smoke"])
def test_the_a3_profiles_run_without_f4_and_the_launcher_says_so(profile) -> None:
    from verl_patches.launch.preflight import report as preflight
    from verl_patches.launch.settings import load_settings

    cfg = preflight.compose("ppo_mindspeed_trainer", [f"profile={profile}"], load_settings({}, None, environ={}), ROOT)
    assert kv_nz_env(cfg) == {KV_NZ_FLAG: "0"}  # both set enable_kv_nz: False, as the vendor's code
    on = preflight.compose(
        "ppo_mindspeed_trainer",
        [f"profile={profile}", f"{GRAPH_CONFIG_KEY}.enable_kv_nz=True"],
        load_settings({}, None, environ={}),
        ROOT,
    )
    assert kv_nz_env(on) == {KV_NZ_FLAG: "1"}


@pytest.mark.parametrize(
    "enabled, nz, flag, ok",
    [
        (True, True, "1", True),
        (True, False, "0", True),
        (True, False, None, True),
        (False, False, None, True),
        (True, True, None, False),
        (True, True, "0", False),
        (True, False, "1", False),
        (False, True, "1", False),
    ],
)
def test_an_engine_whose_config_and_flag_disagree_is_refused(enabled, nz, flag, ok) -> None:
    env = {} if flag is None else {KV_NZ_FLAG: flag}
    kwargs = {"max_num_seqs": 8, "additional_config": {"torchair_graph_config": graph(enabled, nz)}}
    if ok:
        rollout_llm_kwargs(kwargs, env)
        return
    with pytest.raises(EngineArgumentError) as e:
        rollout_llm_kwargs(kwargs, env)
    assert "torchair_graph_config" in str(e.value) and KV_NZ_FLAG in str(e.value)
