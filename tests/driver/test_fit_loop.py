"""Our RayPPOTrainer.fit (vendor item A2) run with fake worker groups that record every DataProto they
receive: the old-log-prob pass is skipped exactly when configured, with D2D the ref call gets a tensor-less
batch of the right size and update_actor only `advantages` plus the whole meta_info, the driver never ships
input_ids/position_ids/ref_log_prob/old_log_probs, and the log-prob mismatch is logged every step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fit_fakes import STEPS, B, Call, FakeWorkerGroup, N, P, R, Recorder, fit_config, make_trainer
from verl_patches.driver import fit_loop
from verl_patches.driver.step_plan import StepPlan
from verl_patches.patches.verl.trainer.ray_trainer import with_overlay_fit
from verl_patches.worker_calls import logprob_mismatch
from verl_patches.worker_calls.step_payloads import NEVER_SHIPPED_WITH_D2D


@pytest.fixture(scope="module")
def base_cfg() -> Any:
    return fit_config()


def payloads(wg: FakeWorkerGroup, method: str) -> list[Call]:
    return [c for c in wg.calls if c.method == method]


def test_skip_with_d2d_ships_only_what_the_workers_cannot_hold(base_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = StepPlan(skip_old_log_prob=True, d2d=True, fused_role=True)
    t, wg = make_trainer(base_cfg, monkeypatch, plan, **{"trainer.balance_batch": True})
    fit_loop.run_fit(t, plan)
    assert "compute_log_prob" not in wg.methods()
    assert wg.methods() == ["generate_sequences", "compute_ref_log_prob", "update_actor"] * STEPS
    for ref in payloads(wg, "compute_ref_log_prob"):
        assert ref.keys == [] and ref.rows == B * N
    for upd in payloads(wg, "update_actor"):
        assert upd.keys == ["advantages"] and upd.rows == B * N
        assert len(upd.meta["global_token_num"]) == B * N and sum(upd.meta["global_token_num"]) == B * N * (P + R) - 1
        assert "multi_turn" in upd.meta
    for c in wg.calls:
        if c.method != "generate_sequences":  # the prompts' input_ids go to generation, as upstream
            assert not set(c.keys) & set(NEVER_SHIPPED_WITH_D2D)
    steps = [s for s, _ in Recorder.logged]
    assert steps == [1, 2, 3]
    assert all(m[logprob_mismatch.ABS_DIFF] == pytest.approx(0.01) for _, m in Recorder.logged)
    assert all("critic/advantages/mean" in m for _, m in Recorder.logged)


def test_skip_without_d2d_ships_the_batch_but_never_old_log_probs(
    base_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = StepPlan(skip_old_log_prob=True, d2d=False, fused_role=False)
    t, wg = make_trainer(base_cfg, monkeypatch, plan)
    fit_loop.run_fit(t, plan)
    assert "compute_log_prob" not in wg.methods()
    for upd in payloads(wg, "update_actor"):
        assert {"input_ids", "position_ids", "ref_log_prob", "advantages", "rollout_log_probs"} <= set(upd.keys)
        assert "old_log_probs" not in upd.keys
    assert all("timing_s/old_log_prob" not in m for _, m in Recorder.logged)
    assert all(m[logprob_mismatch.ABS_DIFF] == pytest.approx(0.01) for _, m in Recorder.logged)


def test_recompute_runs_the_old_log_prob_pass_and_the_driver_measures_the_mismatch(
    base_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = StepPlan(skip_old_log_prob=False, d2d=False, fused_role=False)
    t, wg = make_trainer(base_cfg, monkeypatch, plan)
    fit_loop.run_fit(t, plan)
    assert wg.methods() == ["generate_sequences", "compute_log_prob", "compute_ref_log_prob", "update_actor"] * STEPS
    assert all("old_log_probs" in c.keys for c in payloads(wg, "update_actor"))
    for _, m in Recorder.logged:
        assert m[logprob_mismatch.ABS_DIFF] == pytest.approx(0.01, rel=1e-5)
        assert m[logprob_mismatch.RATIO_DEV] == pytest.approx(np.expm1(0.01), rel=1e-5)
        assert m[logprob_mismatch.TOKENS] == B * N * R - 1
        assert "actor/entropy_loss" in m and "timing_s/old_log_prob" in m


def test_remax_keeps_upstreams_fit(base_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = StepPlan(skip_old_log_prob=False, d2d=False, fused_role=False)
    t, _ = make_trainer(
        base_cfg,
        monkeypatch,
        plan,
        **{
            "algorithm.adv_estimator": "remax",
            "actor_rollout_ref.actor.recompute_old_log_prob": True,
            "overlay.d2d_tensor_cache": False,
        },
    )
    seen = []
    with_overlay_fit(lambda self: seen.append(self))(t)
    assert seen == [t]


def test_inconsistent_config_stops_fit_before_any_worker_call(base_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl_patches.driver.config_checks import OverlayConfigError

    plan = StepPlan(skip_old_log_prob=True, d2d=False, fused_role=False)
    t, wg = make_trainer(base_cfg, monkeypatch, plan, **{"actor_rollout_ref.actor.ppo_epochs": 2})
    with pytest.raises(OverlayConfigError, match="ppo_epochs"):
        with_overlay_fit(lambda self: None)(t)
    monkeypatch.setenv("D2D_DATA_TRANSFER", "1")
    t, wg = make_trainer(base_cfg, monkeypatch, plan)
    with pytest.raises(OverlayConfigError, match="trainer.balance_batch"):  # the base config balances batches
        with_overlay_fit(lambda self: None)(t)
    assert wg.calls == []


def test_worker_summary_names_classes_and_plan(base_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.trainer.ppo.ray_trainer import Role

    monkeypatch.delenv("NO_ALL_TO_ALL_RESHARD", raising=False)
    plan = StepPlan(skip_old_log_prob=True, d2d=True, fused_role=True)
    t, _ = make_trainer(base_cfg, monkeypatch, plan)
    t.role_worker_mapping = {Role.ActorRollout: FakeWorkerGroup}
    line = fit_loop.worker_summary(t, plan)
    assert "ActorRollout=" in line and "FakeWorkerGroup" in line
    assert "ref runs in the actor/rollout worker group: True" in line
    assert "old-log-prob pass skipped" in line and "D2D tensor cache on" in line
    assert "weight sync: Megatron -> vllm, all-to-all (NO_ALL_TO_ALL_RESHARD unset)" in line


@pytest.mark.parametrize("d2d", [True, False])
def test_every_worker_call_carries_the_step_and_the_d2d_flag(
    base_cfg: Any, monkeypatch: pytest.MonkeyPatch, d2d: bool
) -> None:
    from verl_patches.worker_calls.meta_keys import D2D_META_KEY, STEP_META_KEY

    plan = StepPlan(skip_old_log_prob=True, d2d=d2d, fused_role=True)
    t, wg = make_trainer(base_cfg, monkeypatch, plan)
    fit_loop.run_fit(t, plan)
    per_step = len(wg.calls) // STEPS
    for i, c in enumerate(wg.calls):
        assert c.meta[STEP_META_KEY] == 1 + i // per_step, (i, c.method)
        assert c.meta[D2D_META_KEY] is d2d, (i, c.method)
