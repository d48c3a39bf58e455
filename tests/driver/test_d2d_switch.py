"""The D2D tensor cache switch: ``overlay.d2d_tensor_cache`` in the config, the vendor's env
``D2D_DATA_TRANSFER`` overriding it when set (either way), and the config checks naming what turned the
cache on and the key in its way."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_patches.driver.config_checks import d2d_problems
from verl_patches.driver.step_plan import D2D_KEY, d2d_setting, plan_steps

GOOD = {
    "overlay": {"d2d_tensor_cache": True, "fused_actor_rollout_ref": True},
    "actor_rollout_ref": {"actor": {"use_kl_loss": True, "recompute_old_log_prob": False}, "rollout": {"mode": "sync"}},
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "trainer": {"balance_batch": False},
    "reward_model": {"enable": False},
}


def cfg(on: bool | None) -> object:
    c = OmegaConf.create(GOOD)
    if on is None:
        del c.overlay["d2d_tensor_cache"]
    else:
        c.overlay.d2d_tensor_cache = on
    return c


@pytest.mark.parametrize(
    "key, env, on",
    [
        (True, {}, True),
        (False, {}, False),
        (None, {}, False),
        (True, {"D2D_DATA_TRANSFER": "0"}, False),
        (False, {"D2D_DATA_TRANSFER": "1"}, True),
        (None, {"D2D_DATA_TRANSFER": "1"}, True),
        (True, {"D2D_DATA_TRANSFER": ""}, False),
    ],
)
def test_the_environment_wins_over_the_key(key: bool | None, env: dict, on: bool) -> None:
    got, source = d2d_setting(cfg(key), env)
    assert got is on
    assert ("D2D_DATA_TRANSFER" in source) == bool(env) and (D2D_KEY in source) == (not env)
    assert plan_steps(cfg(key), env).d2d is on


def test_problems_name_the_switch_and_the_key() -> None:
    assert d2d_problems(cfg(True), {}) == []
    bad = cfg(True)
    bad.trainer.balance_batch = True
    (problem,) = d2d_problems(bad, {})
    assert problem.startswith("trainer.balance_batch=True") and "overlay.d2d_tensor_cache=True" in problem
    assert d2d_problems(bad, {"D2D_DATA_TRANSFER": "0"}) == []
    (problem,) = d2d_problems(bad, {"D2D_DATA_TRANSFER": "1"})
    assert "D2D_DATA_TRANSFER='1'" in problem


@pytest.mark.parametrize(
    "name, overrides, on",
    [
        ("ppo_tiny_local", [], True),
        ("ppo_mindspeed_trainer", ["profile=a3_16die_smoke"], True),
        ("ppo_mindspeed_trainer", ["profile=a3_256die_random_init"], True),
        ("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight"], True),
        ("ppo_tiny_local_fsdp", [], False),
    ],
)
def test_the_a3_profiles_and_the_tiny_run_use_the_cache(name: str, overrides: list[str], on: bool) -> None:
    from verl_patches.driver.config_checks import check_config
    from verl_patches.trainer.config_compose import compose_config, resolved

    c = resolved(compose_config(name, overrides))
    assert plan_steps(c, {}).d2d is on
    assert check_config(c, environ={}) == []
