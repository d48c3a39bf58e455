"""Preflight: every check fails (naming the key to change) when its condition is broken, the two
production profiles pass on this CPU host with the cluster-only checks not checked here, and the CLI's
exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_patches.data.rl_rows import VERL_RL_SCHEMA
from verl_patches.launch.preflight import files as preflight_files
from verl_patches.launch.preflight.findings import FAIL, NOT_CHECKED, OK, WARN, Context, Finding, HostFacts
from verl_patches.launch.preflight.host import cluster_findings
from verl_patches.launch.preflight.layout import LAYER_LIST, tp_split_findings
from verl_patches.launch.preflight.report import (
    compose,
    exit_status,
    main,
    patch_findings,
    render_text,
    run_preflight,
    sources_findings,
)
from verl_patches.launch.settings import ClusterSettings, load_settings
from verl_patches.trainer.profiles import PROFILES
from verl_patches.weights.config import config_to_json, official_config

ROOT = Path(__file__).resolve().parents[3]
CPU = HostFacts(device="cpu")
NPU = HostFacts(
    device="npu", interfaces=("lo", "enp1s0"), npu_count=16, torch_npu_importable=True, local_addresses=("10.0.0.1",)
)
M = "actor_rollout_ref.actor.megatron"


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch):
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH"):
        monkeypatch.delenv(name, raising=False)
    # the A3 profiles have no checkpoint folder of their own (issue 34): a cluster's, not on this host
    monkeypatch.setenv("CKPT_DIR", "/shared/ckpt/dsv3")


def settings(**values: str) -> ClusterSettings:
    return load_settings({k: v for k, v in values.items()}, None, environ={})


@cache
def cfg_for(profile: str, *overrides: str):
    p = PROFILES[profile]
    return compose(p.config_name, [*p.overrides, *overrides], settings(), ROOT)


def run(profile: str, *overrides: str, host: HostFacts = CPU, s: ClusterSettings | None = None) -> list[Finding]:
    return run_preflight(cfg_for(profile, *overrides), s or settings(), ROOT, host)


def only(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def failed(findings: list[Finding], check: str) -> Finding:
    hits = [f for f in findings if f.check == check and f.status == FAIL]
    assert hits, f"no failure of {check}: {[f for f in findings if f.check == check]}"
    return hits[0]


# ---- the production profiles on this CPU host ----------------------------------------------------


@pytest.mark.parametrize("profile", ["a3_256die_true_weight", "a3_256die_random_init"])
def test_production_profiles_pass_on_cpu_with_cluster_checks_not_checked(profile):
    found = run(profile)
    assert exit_status(found) == 0, [f for f in found if f.status == FAIL]
    # the values given are checked on any host (the port plan, and the launch's own settings check)
    cluster = [
        f for f in found if f.check.startswith("cluster.") and f.check not in ("cluster.port_plan", "cluster.settings")
    ]
    assert {f.check for f in cluster} >= {
        "cluster.master_addr",
        "cluster.socket_ifname",
        "cluster.cann_env",
        "cluster.npu_count",
        "cluster.torch_npu",
        "cluster.ports_free",
    }
    assert all(f.status == NOT_CHECKED for f in cluster)
    assert only(found, "cluster.port_plan")[0].status == OK
    assert only(found, "cluster.settings")[0].status == OK
    for check in (
        "layout.megatron_parallel",
        "layout.layer_list",
        "layout.vllm_dp_size",
        "layout.rollout_batch",
        "memory.training",
        "memory.rollout",
        "memory.rollout_outside_vllm",
        "memory.reshard",
    ):
        assert [f.status for f in only(found, check)] == [OK], only(found, check)
    die = only(found, "memory.die")[0].message
    assert "64 GiB" in die and "assumption" in die


def test_vllm_dp_size_of_each_profile_is_reported():
    assert "2 instance(s), EP128" in only(run("a3_256die_true_weight"), "layout.vllm_dp_size")[0].message
    assert "1 instance(s), EP256" in only(run("a3_256die_random_init"), "layout.vllm_dp_size")[0].message


def test_tiny_profile_passes_on_cpu():
    found = run("tiny")
    assert exit_status(found) == 0
    assert only(found, "cluster")[0].status == OK
    assert not [f for f in found if f.status == NOT_CHECKED and f.check.startswith(("data", "model"))]


def test_random_init_loads_no_checkpoint_true_weight_needs_one_on_npu():
    assert only(run("a3_256die_random_init"), "checkpoint.dist")[0].status == OK
    assert only(run("a3_256die_true_weight"), "checkpoint.dist")[0].status == NOT_CHECKED
    f = failed(run("a3_256die_true_weight", host=NPU), "checkpoint.dist")
    assert "DIST_CKPT_PATH" in f.key


# ---- layout arithmetic ---------------------------------------------------------------------------


def test_world_mismatch_names_nnodes_and_trainer_nnodes():
    f = failed(run("a3_256die_true_weight", s=settings(NNODES="8")), "layout.world_size")
    assert "NNODES" in f.key and "trainer.nnodes" in f.key
    f = failed(run("a3_256die_true_weight", s=settings(NPUS_PER_NODE="8")), "layout.world_size")
    assert "NPUS_PER_NODE" in f.key and "trainer.n_gpus_per_node" in f.key


def test_layer_list_sum_wrong_names_the_layer_list():
    found = run("a3_256die_true_weight", f"{LAYER_LIST}=[7,7,8,8,8,8,8,8]")
    f = failed(found, "layout.layer_list")
    assert f.key == LAYER_LIST and "sums to 62" in f.message
    assert only(found, "memory")[0].status == WARN  # memory needs a valid layout: skipped, said so


def test_tp_that_does_not_divide_the_world_names_tp():
    f = failed(
        run(
            "a3_256die_true_weight",
            f"{M}.tensor_model_parallel_size=3",
            "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=3",
        ),
        "layout.megatron_parallel",
    )
    assert f"{M}.tensor_model_parallel_size" in f.key


def test_ep_that_does_not_divide_dp_names_ep():
    f = failed(
        run(
            "a3_256die_true_weight",
            f"{M}.expert_model_parallel_size=16",
            "actor_rollout_ref.ref.megatron.expert_model_parallel_size=16",
        ),
        "layout.megatron_parallel",
    )
    assert f.key == f"{M}.expert_model_parallel_size" and "does not divide the training DP 8" in f.message


def test_ref_layout_must_match_actor():
    f = failed(
        run("a3_256die_true_weight", "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=4"),
        "layout.ref_matches_actor",
    )
    assert "actor_rollout_ref.ref.megatron" in f.key


def test_tp_splits_and_experts_divisibility():
    model = official_config()
    assert all(f.status == OK for f in tp_split_findings(model, 4, 8))
    bad = dict(model, num_attention_heads=126, n_routed_experts=240, n_group=8)
    found = tp_split_findings(bad, 4, 8)
    f = failed(found, "layout.tp_divisibility")
    assert "num_attention_heads=126" in f.message and f.key == f"{M}.tensor_model_parallel_size"
    f = failed(found, "layout.experts")
    assert f"{M}.expert_model_parallel_size" in f.key and "240" in f.message


def test_rollout_dp_inconsistent_names_vllm_dp_size():
    f = failed(run("a3_256die_true_weight", "overlay.vllm_dp_size=96"), "layout.vllm_dp_size")
    assert f.key == "overlay.vllm_dp_size"
    env = ClusterSettings({**settings().values, "VLLM_DP_SIZE": "128"}, {"VLLM_DP_SIZE": "cluster.env:3"})
    f = failed(run("a3_256die_true_weight", s=env), "layout.vllm_dp_size")
    assert "VLLM_DP_SIZE" in f.key and "overlay.vllm_dp_size" in f.key


def test_rollout_ep_larger_than_experts_fails(tmp_path):
    d = _model_dir(tmp_path, dict(official_config(), n_routed_experts=128))
    f = failed(run("a3_256die_random_init", f"actor_rollout_ref.model.path={d}"), "layout.vllm_dp_size")
    assert f.key == "overlay.vllm_dp_size" and "rollout_ep_at_most_num_experts" in f.message


def test_gbs_times_n_not_divisible_by_rollout_dp_names_train_batch_size():
    f = failed(
        run("a3_256die_true_weight", "data.train_batch_size=500", "actor_rollout_ref.actor.ppo_mini_batch_size=500"),
        "layout.rollout_batch",
    )
    assert f.key == "data.train_batch_size"


def test_batch_not_divisible_by_megatron_dp_times_micro_batch():
    f = failed(
        run("a3_256die_true_weight", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
        "layout.batch_megatron_dp",
    )
    assert f.key == "data.train_batch_size" and "24" in f.message


def test_old_log_prob_skip_needs_one_mini_batch():
    f = failed(run("a3_256die_true_weight", "actor_rollout_ref.actor.ppo_mini_batch_size=256"), "config.semantic")
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" in f.key and "data.train_batch_size" in f.key


def test_model_len_beyond_position_embeddings_and_batched_tokens():
    f = failed(run("a3_256die_true_weight", "data.max_response_length=200000"), "layout.rollout_model_len")
    assert f.key.startswith("data.max_response_length") and "163840" in f.message
    f = failed(
        run("a3_256die_true_weight", "actor_rollout_ref.rollout.enable_chunked_prefill=False"), "rollout.engine"
    )  # the rules of verl_patches.driver.rollout_settings
    assert "actor_rollout_ref.rollout.max_num_batched_tokens" in f.key and "enable_chunked_prefill" in f.key


# ---- files ---------------------------------------------------------------------------------------


def _good_rows(n: int) -> list[dict]:
    return [
        {
            "data_source": "deepscaler",
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "ability": "math",
            "reward_model": {"ground_truth": str(i), "style": "rule"},
            "extra_info": {"index": i, "split": "train", "problem": "p", "solution": "s", "source_row": i},
        }
        for i in range(n)
    ]


def test_data_schema_wrong_names_train_files(tmp_path):
    bad = tmp_path / "train.parquet"
    pq.write_table(pa.table({"data_source": ["x"], "prompt": ["just a string"], "ability": ["math"]}), bad)
    f = failed(run("a3_256die_true_weight", f"data.train_files={bad}"), "data.schema")
    assert f.key.startswith("data.train_files") and "prompt" in f.message and "reward_model" in f.message


def test_data_good_schema_and_too_few_rows(tmp_path):
    good = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_good_rows(10), schema=VERL_RL_SCHEMA), good)
    found = run("a3_256die_true_weight", f"data.train_files={good}")
    assert any(f.status == OK and str(good) in f.message for f in only(found, "data.schema"))
    assert failed(found, "data.rows").key == "data.train_batch_size"  # 10 rows < 512


def test_missing_data_fails_on_npu_host_only(tmp_path):
    missing = tmp_path / "nope.parquet"
    assert only(run("a3_256die_true_weight", f"data.train_files={missing}"), "data.files")[0].status == NOT_CHECKED
    f = failed(run("a3_256die_true_weight", f"data.train_files={missing}", host=NPU), "data.files")
    assert f.key.startswith("data.train_files")


def _model_dir(tmp_path: Path, cfg: dict, tokenizer: bool = True) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(config_to_json(cfg))
    if tokenizer:
        (d / "tokenizer_config.json").write_text("{}")
    return d


def test_model_config_invalid_names_model_path(tmp_path):
    d = _model_dir(tmp_path, dict(official_config(), num_nextn_predict_layers=1))
    f = failed(run("a3_256die_true_weight", f"actor_rollout_ref.model.path={d}"), "model.config")
    assert f.key.startswith("actor_rollout_ref.model.path") and "num_nextn_predict_layers" in f.message


def test_model_config_valid_is_used_for_the_arithmetic(tmp_path):
    d = _model_dir(tmp_path, dict(official_config(), num_hidden_layers=60))
    found = run("a3_256die_true_weight", f"actor_rollout_ref.model.path={d}")
    assert only(found, "model.config")[0].status == OK and only(found, "model.tokenizer")[0].status == OK
    assert "not num_hidden_layers=60" in failed(found, "layout.layer_list").message


def test_model_without_tokenizer_fails(tmp_path):
    d = _model_dir(tmp_path, official_config(), tokenizer=False)
    f = failed(run("a3_256die_true_weight", f"actor_rollout_ref.model.path={d}"), "model.tokenizer")
    assert f.key.startswith("actor_rollout_ref.model.path")


def _checkpoint(tmp_path: Path, tp: int = 4, pp: int = 8, ep: int = 8) -> Path:
    root = tmp_path / "ckpt"
    root.mkdir(parents=True)
    (root / preflight_files.TRACKER_FILE).write_text("1\n")
    for t in range(tp):
        for p in range(pp):
            for e in range(ep):
                d = root / "iter_0000001" / f"mp_rank_{t:02d}_{p:03d}_{e:03d}"
                d.mkdir(parents=True)
                (d / preflight_files.CKPT_FILE).write_bytes(b"")
    return root


def test_checkpoint_layout_complete_missing_rank_and_other_layout(tmp_path):
    ckpt = _checkpoint(tmp_path)
    over = (f"{M}.dist_checkpointing_path={ckpt}",)
    assert only(run("a3_256die_true_weight", *over), "checkpoint.dist")[0].status == OK
    (ckpt / "iter_0000001" / "mp_rank_03_007_007" / preflight_files.CKPT_FILE).unlink()
    f = failed(run("a3_256die_true_weight", *over), "checkpoint.dist")
    assert "DIST_CKPT_PATH" in f.key and "1 of 256 rank files missing" in f.message
    other = _checkpoint(tmp_path / "b", tp=4, pp=8, ep=4)
    f = failed(run("a3_256die_true_weight", f"{M}.dist_checkpointing_path={other}"), "checkpoint.dist")
    assert "128 of 256" in f.message


def test_checkpoint_constants_match_the_converter():
    from verl_patches.weights import hf_to_mcore

    assert preflight_files.TRACKER_FILE == hf_to_mcore.TRACKER_FILE
    assert preflight_files.CKPT_FILE == hf_to_mcore.CKPT_FILE
    assert preflight_files.CONVERSION_MANIFEST == hf_to_mcore.MANIFEST_FILE


# ---- cluster node --------------------------------------------------------------------------------


def _ctx(host: HostFacts, **values: str) -> Context:
    return Context(cfg_for("a3_256die_true_weight"), settings(**values), ROOT, host)


def test_npu_host_missing_master_addr_and_nic_fail():
    found = cluster_findings(_ctx(NPU), port_probe=lambda p: False)
    assert failed(found, "cluster.master_addr").key == "MASTER_ADDR"
    assert failed(found, "cluster.socket_ifname").key == "SOCKET_IFNAME"


def test_npu_host_real_checks(tmp_path):
    toolkit, nnal = tmp_path / "set_env.sh", tmp_path / "nnal.sh"
    toolkit.write_text("")
    good = dict(MASTER_ADDR="127.0.0.1", SOCKET_IFNAME="enp1s0", CANN_TOOLKIT_ENV=str(toolkit), CANN_NNAL_ENV=str(nnal))
    found = cluster_findings(_ctx(NPU, **good), port_probe=lambda p: False)
    by = {(f.check, f.key): f.status for f in found}
    assert by[("cluster.master_addr", "")] == OK and by[("cluster.socket_ifname", "")] == OK
    assert failed(found, "cluster.cann_env").key == "CANN_NNAL_ENV"
    nnal.write_text("")
    weak = HostFacts(device="npu", interfaces=("lo",), npu_count=8, torch_npu_importable=False)
    found = cluster_findings(_ctx(weak, **good), port_probe=lambda p: p == 64250)
    assert failed(found, "cluster.socket_ifname").key == "SOCKET_IFNAME"
    assert failed(found, "cluster.npu_count").key == "NPUS_PER_NODE"
    assert "torch_npu" in failed(found, "cluster.torch_npu").key
    busy = only(found, "cluster.ports_free")[0]
    assert busy.status == WARN and busy.key == "HCCL_IF_BASE_PORT" and "64250" in busy.message


def test_planned_ports_inside_ranges_handed_out_by_others_are_named():
    """verl's workers get their torch.distributed port from the kernel's ephemeral range, every outgoing
    connection takes one from it, and Ray hands out its worker ports itself: a planned port in those ranges can
    be held by the job itself."""
    good = dict(MASTER_ADDR="127.0.0.1", SOCKET_IFNAME="lo")
    host = HostFacts(device="npu", interfaces=("lo",), npu_count=16, torch_npu_importable=True)

    def handed_out(eph, **settings):
        found = cluster_findings(_ctx(host, **good, **settings), port_probe=lambda p: False, ephemeral=eph)
        return [f for f in found if f.check == "cluster.ports_handed_out"]

    assert handed_out((32768, 60999)) == []  # the defaults are outside
    (f,) = handed_out((32768, 60999), MASTER_PORT="40000")
    assert f.status == WARN and f.key == "MASTER_PORT"
    assert "MASTER_PORT 40000" in f.message and "vLLM DP master ports (MASTER_PORT+1..) 40001.." in f.message
    assert "ephemeral port range (net.ipv4.ip_local_port_range) 32768..60999" in f.message
    (f,) = handed_out((29000, 29445))
    assert f.key == "MASTER_PORT" and "HCCL" not in f.message  # only what lies inside is named
    (f,) = handed_out((64250, 64250))
    assert f.key == "HCCL_IF_BASE_PORT"
    (f,) = handed_out((32768, 60999), MASTER_PORT="15000")
    assert "Ray's client server and worker ports 10001..19999" in f.message and f.key == "MASTER_PORT"
    assert "ip_local_reserved_ports" not in f.message  # that sysctl governs the ephemeral range only
    (f,) = handed_out((32768, 60999), RAY_DASHBOARD_PORT="10500")
    assert f.key == "RAY_DASHBOARD_PORT" and "worker ports" in f.message
    (f,) = handed_out((29000, 29445))
    assert "ip_local_reserved_ports" in f.message


def test_dry_run_of_the_tiny_profile_refuses_a_malformed_dp_base_port_as_the_launch_does(monkeypatch):
    from verl_patches.launch.job import tiny_rollout_env
    from verl_patches.rollout.dp_env import DpEnvError
    from verl_patches.trainer.profiles import TINY_CONFIG

    def dp_ports(environ):
        ctx = Context(cfg_for("tiny"), settings(), ROOT, CPU)
        return [f for f in cluster_findings(ctx, environ=environ) if f.check == "local.dp_ports"]

    assert dp_ports({}) == []  # picked at launch
    (ok,) = dp_ports({"VERL_PATCHES_VLLM_DP_BASE_PORT": "25000"})
    assert ok.status == OK and "from 25001" in ok.message
    for bad in ("25x", "70000", "-3"):
        (f,) = dp_ports({"VERL_PATCHES_VLLM_DP_BASE_PORT": bad})
        assert f.status == FAIL and f.key == "VERL_PATCHES_VLLM_DP_BASE_PORT"
        with pytest.raises(DpEnvError):  # and the launch refuses the same values
            tiny_rollout_env(TINY_CONFIG, [], {"VERL_PATCHES_VLLM_DP_BASE_PORT": bad})
    monkeypatch.setenv("VERL_PATCHES_VLLM_DP_BASE_PORT", "nope")
    found = run("tiny")
    assert failed(found, "local.dp_ports").key == "VERL_PATCHES_VLLM_DP_BASE_PORT" and exit_status(found) != 0


def test_bad_master_addr_fails_even_on_cpu():
    assert (
        failed(cluster_findings(_ctx(CPU, MASTER_ADDR="not an address!")), "cluster.master_addr").key == "MASTER_ADDR"
    )


def test_port_plan_overlap_names_the_setting():
    f = failed(cluster_findings(_ctx(CPU, HCCL_IF_BASE_PORT="29440")), "cluster.port_plan")
    assert f.key == "HCCL_IF_BASE_PORT" and "overlaps HCCL_IF_BASE_PORT 29440..29455" in f.message
    f = failed(cluster_findings(_ctx(CPU, RAY_DASHBOARD_PORT="29446")), "cluster.port_plan")
    assert "overlaps" in f.message  # vLLM DP master ports are MASTER_PORT+1..+4


# ---- sources and patches -------------------------------------------------------------------------


def test_sources_missing_components(tmp_path):
    shutil.copy(ROOT / "sources.lock", tmp_path / "sources.lock")
    cpu, _ = sources_findings(tmp_path, CPU)
    by = {f.check: f for f in cpu}
    assert by["sources.verl"].status == FAIL and "setup_sources.sh" in by["sources.verl"].key
    assert by["sources.mindspeed"].status == NOT_CHECKED  # needed on NPU only
    npu, _ = sources_findings(tmp_path, NPU)
    assert {f.check: f.status for f in npu}["sources.mindspeed"] == FAIL


def test_sources_here_match_the_lock():
    found, comps = sources_findings(ROOT, CPU)
    assert all(f.status in (OK, NOT_CHECKED) for f in found)
    assert "verl" in comps


def test_patches_drift_and_missing_targets_fail(tmp_path, monkeypatch):
    shutil.copy(ROOT / "sources.lock", tmp_path / "sources.lock")
    _, comps = sources_findings(tmp_path, CPU)
    found = patch_findings(tmp_path, comps)
    assert any(f.status == FAIL and "target-missing" in f.message for f in found)
    from verl_patches.patching import static_report

    monkeypatch.setattr(
        static_report,
        "static_patch_report",
        lambda root, patches: [
            {"name": "x.y", "target": "verl.a:b", "status": "drift", "detail": "declared 1, found 2"}
        ],
    )
    f = failed(patch_findings(ROOT, {}), "patches")
    assert "x.y" in f.key and "drift" in f.message


# ---- memory --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "overrides", "check", "key"),
    [
        pytest.param(
            "a3_256die_true_weight",
            ["actor_rollout_ref.rollout.gpu_memory_utilization=0.95"],
            "memory.rollout_outside_vllm",
            "actor_rollout_ref.rollout.gpu_memory_utilization",
            id="outside vLLM over budget: utilisation",
        ),
        pytest.param(
            "a3_256die_true_weight",
            [f"{M}.param_offload=False", f"{M}.grad_offload=False"],
            "memory.rollout_outside_vllm",
            f"{M}.param_offload",
            id="actor left on the die: param offload",
        ),
        pytest.param(
            "a3_256die_true_weight",
            ["actor_rollout_ref.rollout.gpu_memory_utilization=0.4"],
            "memory.rollout",
            "actor_rollout_ref.rollout.gpu_memory_utilization",
            id="rollout without room for weights: utilisation",
        ),
        pytest.param(
            "a3_256die_true_weight",
            [f"{M}.swap_optimizer=False", f"{M}.use_distributed_optimizer=False"],
            "memory.training",
            f"{M}.swap_optimizer",
            id="training without the swap optimizer",
        ),
        pytest.param(
            "a3_256die_random_init",
            ["data.max_response_length=8192"],
            "memory.training",
            "actor_rollout_ref.model.enable_gradient_checkpointing",
            id="long sequences without recompute",
        ),
    ],
)
def test_a_memory_refusal_names_the_key_to_change(profile: str, overrides: list[str], check: str, key: str):
    assert failed(run(profile, *overrides), check).key == key


# ---- report and CLI ------------------------------------------------------------------------------


def test_render_text_table_and_summary():
    found = [Finding("a.b", OK, "fine"), Finding("c.d", FAIL, "broken " * 30, "some.key")]
    text = render_text(found)
    assert text.splitlines()[0].split() == ["STATUS", "CHECK", "MESSAGE", "KEY", "TO", "CHANGE"]
    assert "some.key" in text and text.rstrip().endswith("fail): c.d")


def test_cli_exit_codes(capsys):
    assert main(["--profile", "a3_256die_true_weight"], host=CPU) == 0
    assert "preflight: PASS" in capsys.readouterr().out
    assert main(["--profile", "a3-256die-random-init", "--nnodes", "8", "--json"], host=CPU) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["exit_status"] == 1 and "layout.world_size" in out["summary"]["failed"]
    assert main(["--profile", "tiny", "--bogus"], host=CPU) == 2
    assert main(["--profile", "a3_256die_true_weight", "actor_rollout_ref.actor.no_such_key=1"], host=CPU) == 2
    assert "no_such_key" in capsys.readouterr().err


def test_cli_setting_flag(capsys):
    assert main(["--profile", "a3_256die_true_weight", "--setting", "HCCL_IF_BASE_PORT=29440"], host=CPU) == 1
    assert "cluster.port_plan" in capsys.readouterr().out
    assert main(["--profile", "tiny", "--setting", "NOPE=1"], host=CPU) == 2
    assert "--setting 'NOPE=1'" in capsys.readouterr().err


def test_tiny_profile_on_an_npu_host_is_not_a_cluster_job():
    found = run("tiny", "trainer.device=npu", host=NPU)
    assert only(found, "cluster")[0].status == OK and only(found, "layout.world_size")[0].status == OK


def test_cli_env_file_and_paths(tmp_path, capsys):
    env = tmp_path / "cluster.env"
    env.write_text(f"MASTER_ADDR=10.1.2.3\nSOCKET_IFNAME=enp1s0\nDATA_DIR={tmp_path / 'data'}\n")
    assert main(["--profile", "a3_256die_true_weight", "--env-file", str(env), "--json"], host=CPU) == 0
    out = json.loads(capsys.readouterr().out)
    files = [f["message"] for f in out["findings"] if f["check"] == "data.files"]
    assert files and all(str(tmp_path / "data") in m for m in files)
    assert main(["--profile", "tiny", "--env-file", str(tmp_path / "missing.env")], host=CPU) == 2
    assert "missing.env" in capsys.readouterr().err


def test_no_profile_names_the_profiles_and_checks_nothing(capsys):
    """A bare preflight would check verl's gsm8k example config, not any run of ours: it asks which run instead."""
    assert main([], host=CPU) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert captured.out == "" and line.startswith("preflight: which run? give --profile ")
    for name in PROFILES:
        assert name in line
    assert main(["--json"], host=CPU) == 2
    assert main(["--config-name", "ppo_tiny_local"], host=CPU) == 0  # a config named explicitly is checked as is


def test_module_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "verl_patches.launch.preflight", "--profile", "a3_256die_true_weight", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"]["passed"] is True
