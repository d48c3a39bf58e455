"""End to end on this CPU machine: verl v0.4.0's real GRPO trainer through our entry and patches only.

The slow tests here start a local Ray cluster and train the tiny DeepSeek-V3-shaped model on generated
additions with our reward:

* README command 1 (`train_deepseekv3_256die_random_init.sh --tiny`), the A3 path: verl's Megatron actor and
  reference through MindSpeed on the torch_npu emulation (TP2 x EP2, 4 ranks), verl's vLLM rollout driving
  vllm-ascend's own engine (NPUModelRunner, CustomDeepseekV3ForCausalLM, TorchAir graph mode) at rollout TP2
  (one instance of DP2 x TP2, EP4), most sampled tokens from graph decodes, our weight sync, the fused
  actor_rollout_ref group, no old-log-prob pass. ONE run of 60
  steps (the session fixture `a3_run` of conftest.py) serves every A3 test, including the golden-metrics
  check against the stored baseline and the kill-and-resume test's reference, so the suite pays for one
  tiny run.

The FSDP + HF option (`--tiny-engine fsdp`) runs in tests/checkpoint/test_trainer_resume_e2e.py (two launches
of one step each, the second resuming the first), outside this serial part of the suite.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from tiny_job import REPO, TinyRun, env_for_run
from verl_patches.base import cpu_numerics
from verl_patches.patching.activation_record import read_records

BASELINE = REPO / "verl_patches" / "trainer" / "config" / "ppo_tiny_local.baseline.json"
WALL_LINE = re.compile(r"trainer exited with status (\d+) after (\d+) s wall time")
MISMATCH_TOL = 1e-3  # fp32 on CPU: vllm-ascend's engine vs Megatron actor, same weights after the sync
ENGINE_LINE = re.compile(r"verl_patches rollout engine: (.*)")
STEPS, TEST_FREQ = 60, 20
VAL_KEY = "val-core/deepscaler/reward/mean@1"


def _ok(run: TinyRun) -> None:
    assert run.returncode == 0, run.output[-6000:]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_tiny_a3_path_raises_the_mean_reward(a3_run: TinyRun) -> None:
    _ok(a3_run)
    scores = [a3_run.steps[n]["critic/score/mean"] for n in sorted(a3_run.steps)]
    assert len(scores) == STEPS, scores
    first, last = sum(scores[:5]) / 5, sum(scores[-10:]) / 10
    assert last > 0.3 and last >= first + 0.15, (
        f"reward did not rise: first 5 {first:.3f}, last 10 {last:.3f}: {scores}"
    )
    wall = WALL_LINE.search(a3_run.output)
    assert wall and wall.group(1) == "0", a3_run.output[-2000:]
    print(f"tiny A3-path run: {STEPS} steps, reward {first:.3f} -> {last:.3f}, wall time {wall.group(2)} s")


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_tiny_a3_path_runs_the_a3_components(a3_run: TinyRun) -> None:
    _ok(a3_run)
    out = a3_run.output
    summary = next((line for line in out.splitlines() if "verl_patches fit: workers [" in line), "")
    # verl's Megatron worker for the fused role, the reference inside it, the skipped pass, our sync path
    assert "verl.workers.megatron_workers.ActorRolloutRefWorker" in summary, summary or out[-3000:]
    assert "ref runs in the actor/rollout worker group: True" in summary, summary
    assert "old-log-prob pass skipped" in summary and "Megatron -> vllm" in summary, summary
    for n, metrics in a3_run.steps.items():
        for key in ("actor/pg_loss", "actor/kl_loss", "timing_s/gen", "timing_s/update_actor", "timing_s/reshard"):
            assert key in metrics and math.isfinite(metrics[key]), (n, key, metrics)
        assert "timing_s/old_log_prob" not in metrics, (n, metrics)  # the pass is skipped
    # validation of the base model before step 1, then every test_freq steps on the same path (and the rollout
    # reloaded for the next step); it rises with training (the golden check holds its floors and its rise)
    val_steps = sorted(n for n, m in a3_run.steps.items() if any(k.startswith("val-") for k in m))
    assert val_steps == list(range(TEST_FREQ, STEPS + 1, TEST_FREQ)), val_steps
    base = a3_run.validation_before_training
    assert base is not None and VAL_KEY in base, a3_run.output[-3000:]
    assert a3_run.steps[STEPS][VAL_KEY] > base[VAL_KEY], (base[VAL_KEY], [a3_run.steps[n][VAL_KEY] for n in val_steps])
    assert a3_run.run_dir is not None and (a3_run.run_dir / "rank_memory.jsonl").is_file()
    assert list((a3_run.run_dir / "tensorboard").rglob("events.out.tfevents.*")), "no TensorBoard events written"
    # the prelude ran in the driver, the task runner and the four workers: one record per process, written by
    # the process itself (the console lines can be folded by Ray's log deduplication)
    records = read_records(a3_run.run_dir / "activations")
    assert len({(r["host"], r["pid"]) for r in records}) >= 6, records
    ray_workers = [r for r in records if r["argv0"].endswith("default_worker.py")]
    assert len(ray_workers) >= 5, [r["argv0"] for r in records]  # the task runner and the four workers
    for r in records:
        assert r["summary"].startswith(f"verl_patches active in pid {r['pid']} (device=cpu)"), r
        assert r["patches"]["vllm.general_plugins_at_import"] in ("applied", "pending"), r
        # every process, the Ray workers included, ran on the pinned CPU code path and one thread
        assert r["cpu_numerics"] == cpu_numerics.PINS, r
    assert "package versions: all " in out, out[:3000]  # launcher and driver: A3's pins installed as pinned
    # the engine that generated, read from the built engine: one line per vLLM rank (one instance of DP2 x TP2)
    engines = {m.group(1) for m in ENGINE_LINE.finditer(out)}
    assert engines, out[-3000:]
    for line in engines:
        assert line.startswith(
            "vllm_ascend.worker.model_runner_v1.NPUModelRunner running "
            "vllm_ascend.models.deepseek_v2.CustomDeepseekV3ForCausalLM on npu:0 (float32), "
            "TorchAir graph mode, graphs compiled, EP 4 (DP 2 x TP 2); "
            "attention vllm_ascend.attention.mla_v1.AscendMLAImpl; "
            "MoE vllm_ascend.ops.fused_moe.AscendFusedMoE; "
        ), line
        assert "top-k/top-p from vllm_ascend.patch.worker.patch_common.patch_sampler" in line, line
    assert "cpu.verl.vllm_rollout_spmd.LLM.standin" not in {
        name for r in records for name, status in r["patches"].items() if status == "applied"
    }
    # most sampled tokens of every step come from TorchAir graph decodes, as on A3 (the golden check holds the
    # recorded floor; this is the absolute claim README makes)
    shares = {n: m.get("rollout/graph_decode_token_share") for n, m in a3_run.steps.items() if n >= 1}
    assert all(v is not None and v > 0.5 for v in shares.values()), shares


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_tiny_a3_path_rollout_and_training_log_probs_agree(a3_run: TinyRun) -> None:
    _ok(a3_run)
    for n, metrics in sorted(a3_run.steps.items()):
        for key in ("rollout_mismatch/logprob_abs_diff_mean", "rollout_mismatch/ratio_abs_dev_mean"):
            assert key in metrics, (n, key, sorted(metrics))
            assert metrics[key] < MISMATCH_TOL, (n, key, metrics[key])


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_tiny_a3_path_matches_its_golden_baseline(a3_run: TinyRun) -> None:
    _ok(a3_run)
    proc = subprocess.run(
        [sys.executable, "-m", "verl_patches.cpu_proof.golden", str(a3_run.run_dir), "--check-against", str(BASELINE)],
        cwd=REPO,
        env=env_for_run(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
