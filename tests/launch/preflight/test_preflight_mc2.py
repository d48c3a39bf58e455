"""The preflight's MC2 check: HCCL_BUFFSIZE as the job exports it (env file, else launch/job_env.py) against the
documented MC2 rule at each A3 profile's sizes. Every profile passes at its setting; a setting one MB short, a
value that is not a number, a batch the kernel refuses and experts that do not divide over EP fail, each naming
what to change, the MB needed and the sizes it follows from."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from verl_patches.launch.job_env import STATIC_VARS
from verl_patches.launch.preflight.findings import FAIL, OK, Context, HostFacts
from verl_patches.launch.preflight.mc2 import CHECK, mc2_buffer_findings
from verl_patches.launch.preflight.report import compose, exit_status, run_preflight
from verl_patches.launch.settings import ClusterSettings, load_settings
from verl_patches.trainer.profiles import PROFILES
from verl_patches.weights.config import make_tiny_config, official_config

ROOT = Path(__file__).resolve().parents[3]
CPU = HostFacts(device="cpu")
FULL = official_config()
SMOKE = official_config() | {"num_hidden_layers": 5}  # what make_config.py --set num_hidden_layers=5 writes


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch):
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CKPT_DIR", "/shared/ckpt/dsv3")


def env_file(tmp_path: Path, text: str) -> ClusterSettings:
    path = tmp_path / "cluster.env"
    path.write_text(text)
    return load_settings({}, path, environ={})


@cache
def cfg_for(profile: str, *overrides: str):
    p = PROFILES[profile]
    return compose(p.config_name, [*p.overrides, *overrides], load_settings({}, None, environ={}), ROOT)


def mc2(profile: str, model: dict, s: ClusterSettings | None = None, *overrides: str):
    ctx = Context(
        cfg=cfg_for(profile, *overrides), settings=s or load_settings({}, None, environ={}), root=ROOT, host=CPU
    )
    return mc2_buffer_findings(ctx, model)


def test_the_job_exports_300_mb_unless_the_env_file_says_otherwise():
    assert [v.value for v in STATIC_VARS if v.name == "HCCL_BUFFSIZE"] == ["300"]


@pytest.mark.parametrize(
    "profile, need, sizes",
    [
        ("a3_256die_true_weight", 240, "BS 32 tokens per rank, H 7168, top-k 8, EP 128, 2 expert(s) per rank"),
        ("a3_256die_random_init", 240, "BS 32 tokens per rank, H 7168, top-k 8, EP 256, 1 expert(s) per rank"),
    ],
)
def test_the_256_die_profiles_pass_in_the_preflight_at_the_jobs_setting(profile, need, sizes):
    found = [
        f for f in run_preflight(cfg_for(profile), load_settings({}, None, environ={}), ROOT, CPU) if f.check == CHECK
    ]
    assert [f.status for f in found] == [OK], found
    text = found[0].message
    assert text.startswith("HCCL_BUFFSIZE=300 MB (the job's own, launch/job_env.py); MC2 needs ")
    assert f"needs {need} MB by npu_moe_distribute_dispatch_v2's rule" in text and sizes in text
    assert "64 decode tokens per DP rank (max_num_seqs / graph batch) over rollout TP2" in text


def test_the_smoke_profile_passes_and_dispatch_v1s_rule_sets_its_need():
    (f,) = mc2("a3_16die_smoke", SMOKE)
    assert f.status == OK and "needs 121 MB by npu_moe_distribute_dispatch's rule (121 MB; dispatch_v2's: 120 MB)" in (
        f.message
    )
    assert "32 decode tokens per DP rank" in f.message and "EP 16, 16 expert(s) per rank" in f.message


@pytest.mark.parametrize(
    "profile, model, short, enough",
    [
        ("a3_256die_true_weight", FULL, 239, 240),
        ("a3_256die_random_init", FULL, 239, 240),
        ("a3_16die_smoke", SMOKE, 120, 121),
    ],
)
def test_one_mb_short_of_the_rule_fails_naming_the_setting_the_need_and_the_sizes(
    tmp_path, profile, model, short, enough
):
    (f,) = mc2(profile, model, env_file(tmp_path, f"HCCL_BUFFSIZE={short}\n"))
    assert f.status == FAIL and f.key == "HCCL_BUFFSIZE", f
    assert f.message.startswith(f"HCCL_BUFFSIZE={short} MB ({tmp_path / 'cluster.env'}:1); MC2 needs {enough} MB")
    assert f.message.endswith(f"set HCCL_BUFFSIZE={enough} or more (env file)") and "H 7168, top-k 8" in f.message
    (ok,) = mc2(profile, model, env_file(tmp_path, f"HCCL_BUFFSIZE={enough}\n"))
    assert ok.status == OK, ok


def test_a_short_setting_fails_the_whole_preflight(tmp_path):
    s = env_file(tmp_path, "HCCL_BUFFSIZE=200\n")
    found = run_preflight(cfg_for("a3_256die_true_weight"), s, ROOT, CPU)
    (f,) = [f for f in found if f.check == CHECK]
    assert f.status == FAIL and "MC2 needs 240 MB" in f.message and exit_status(found) != 0


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "3.5", "1_0"])
def test_a_setting_that_is_not_a_positive_integer_fails_by_name(tmp_path, raw):
    (f,) = mc2("a3_256die_true_weight", FULL, env_file(tmp_path, f"HCCL_BUFFSIZE={raw}\n"))
    assert (
        f.status == FAIL and f.key == "HCCL_BUFFSIZE" and f"HCCL_BUFFSIZE ({tmp_path / 'cluster.env'}:1)" in f.message
    )


def test_a_larger_batch_needs_more_and_a_batch_over_512_per_rank_is_refused():
    # train_batch_size 4096 x n 16 / 128 engines = 512 sequences per DP rank: BS 256 per TP rank;
    # 2 x (2 x 256 x 128 x 14848 + 9 x 256 x 14336) = 2012217344 B = 1918.99 MB
    (f,) = mc2("a3_256die_true_weight", FULL, None, "data.train_batch_size=4096")
    assert f.status == FAIL and f.key == "HCCL_BUFFSIZE" and "MC2 needs 1919 MB" in f.message and "BS 256" in f.message
    big = mc2("a3_256die_true_weight", FULL, None, "data.train_batch_size=16384")  # BS 1024
    assert {x.key for x in big} == {"actor_rollout_ref.rollout.max_num_seqs", "HCCL_BUFFSIZE"}
    assert any("MC2 dispatches at most 512 tokens per rank on A3, this profile 1024" in x.message for x in big)


def test_experts_that_do_not_divide_over_ep_are_refused():
    found = mc2("a3_256die_true_weight", FULL | {"n_routed_experts": 200})
    (f,) = [f for f in found if f.key == "overlay.vllm_dp_size"]
    assert f.status == FAIL and "200 routed experts to divide evenly over EP128" in f.message
    # vLLM's expert map gives the last rank the remainder (200 - 127 = 73 experts): its window is sized for that
    assert "73 expert(s) per rank" in next(x.message for x in found if x.key == "HCCL_BUFFSIZE")


def test_no_mc2_below_ep16_and_no_hccl_on_the_tiny_profile():
    (f,) = mc2("a3_16die_smoke", SMOKE, None, "overlay.vllm_dp_size=4")  # EP8
    assert f.status == OK and f.message.startswith("n/a: EP8 < 16")
    (t,) = mc2("tiny", make_tiny_config())
    assert t.status == OK and "without HCCL" in t.message
