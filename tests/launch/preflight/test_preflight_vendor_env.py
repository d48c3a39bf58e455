"""The vendor's variables are refused or mapped by name (issue 42, item 5): every variable of the vendor recipe that
works differently here, at every value, against the A3 profiles' real configs; the env file's lines win over the
environment and name their line; a misspelt switch is refused with the accepted spellings; the dry run prints them
and the launch refuses the same ones before it starts anything."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from no_process_starts import refuse_process_starts, worker_launch
from verl_patches.launch import job
from verl_patches.launch.preflight.findings import FAIL, OK, WARN, Context, HostFacts
from verl_patches.launch.preflight.report import compose, run_preflight
from verl_patches.launch.preflight.vendor_env import (
    CHECK,
    GRAPH_MODE_KEY,
    HANDLERS,
    Seen,
    seen_variables,
    vendor_env_findings,
    vendor_findings,
)
from verl_patches.launch.settings import load_settings
from verl_patches.trainer.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch):
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CKPT_DIR", "/shared/ckpt/dsv3")


@cache
def cfg_for(profile: str, *overrides: str):
    p = PROFILES[profile]
    return compose(p.config_name, [*p.overrides, *overrides], load_settings({}, None, environ={}), ROOT)


def one(name: str, value: str, profile: str = "a3_256die_true_weight", *overrides: str, world: int | None = 256):
    (f,) = vendor_findings({name: Seen(name, value, "environment")}, cfg_for(profile, *overrides), world)
    assert f.check == CHECK and name in f.message or f.key in f.message
    return f


# (variable, value, profile, overrides) -> (status, key to change)
CASES = [
    ("VLLM_ENABLE_GRAPH_MODE", "1", "a3_256die_true_weight", (), WARN, "VLLM_ENABLE_GRAPH_MODE"),
    ("VLLM_ENABLE_GRAPH_MODE", "0", "a3_256die_true_weight", (), FAIL, GRAPH_MODE_KEY),
    (
        "VLLM_ENABLE_GRAPH_MODE",
        "0",
        "a3_256die_true_weight",
        (f"{GRAPH_MODE_KEY}=False",),
        WARN,
        "VLLM_ENABLE_GRAPH_MODE",
    ),
    ("VLLM_ENABLE_GRAPH_MODE", "1", "a3_256die_true_weight", (f"{GRAPH_MODE_KEY}=False",), FAIL, GRAPH_MODE_KEY),
    ("VLLM_ENABLE_FIX_ROUTE", "1", "a3_256die_random_init", (), FAIL, "VLLM_ENABLE_FIX_ROUTE"),
    ("VLLM_ENABLE_FIX_ROUTE", "0", "a3_256die_true_weight", (), WARN, "VLLM_ENABLE_FIX_ROUTE"),
    ("VLLM_ENABLE_MC2", "1", "a3_256die_true_weight", (), WARN, "VLLM_ENABLE_MC2"),
    ("VLLM_ENABLE_MC2", "0", "a3_256die_true_weight", (), FAIL, "VLLM_ENABLE_MC2"),
    ("VLLM_ASCEND_ACL_OP_INIT_MODE", "0", "a3_256die_true_weight", (), WARN, "VLLM_ASCEND_ACL_OP_INIT_MODE"),
    ("VLLM_ASCEND_ACL_OP_INIT_MODE", "1", "a3_256die_true_weight", (), WARN, "VLLM_ASCEND_ACL_OP_INIT_MODE"),
    ("ROLLOUT_REBALANCE_ENABLE", "1", "a3_256die_true_weight", (), FAIL, "ROLLOUT_REBALANCE_ENABLE"),
    ("ROLLOUT_REBALANCE_ENABLE", "0", "a3_256die_true_weight", (), WARN, "ROLLOUT_REBALANCE_ENABLE"),
    ("VLLM_DP_SIZE", "64", "a3_256die_true_weight", (), WARN, "VLLM_DP_SIZE"),
    ("VLLM_DP_SIZE", "128", "a3_256die_true_weight", (), FAIL, "overlay.vllm_dp_size"),
    ("VLLM_DP_SIZE", "128", "a3_256die_random_init", (), WARN, "VLLM_DP_SIZE"),
    ("WORLD_SIZE", "256", "a3_256die_true_weight", (), WARN, "WORLD_SIZE"),
    ("WORLD_SIZE", "16", "a3_256die_true_weight", (), FAIL, "NNODES, NPUS_PER_NODE"),
    ("LD_PRELOAD", "/usr/local/lib/libjemalloc.so.2", "a3_256die_true_weight", (), WARN, "JEMALLOC_LIB"),
]


@pytest.mark.parametrize("name, value, profile, overrides, status, key", CASES)
def test_each_vendor_variable_at_each_value(name, value, profile, overrides, status, key) -> None:
    f = one(name, value, profile, *overrides)
    assert (f.status, f.key) == (status, key), f.message
    assert f"{name}={value!r} (environment)" in f.message  # the line names the variable, its value and origin


def test_every_handled_variable_has_a_case_at_each_switch_position() -> None:
    covered = {(n, v) for n, v, *_ in CASES}
    for name in HANDLERS:
        assert {v for n, v in covered if n == name} >= ({"0", "1"} if name != "VLLM_DP_SIZE" else {"64", "128"})


def test_the_graph_mode_line_names_the_key_and_the_profiles() -> None:
    f = one("VLLM_ENABLE_GRAPH_MODE", "1")
    assert (
        "VLLM_ENABLE_GRAPH_MODE is the vendor's switch; here torchair graph mode is "
        f"{GRAPH_MODE_KEY} (on in the A3 profiles; on in this config)" in f.message
    )


@pytest.mark.parametrize("name", ["VLLM_ENABLE_GRAPH_MODE", "VLLM_ENABLE_FIX_ROUTE", "VLLM_DP_SIZE", "WORLD_SIZE"])
def test_a_misspelt_value_is_refused_with_what_is_accepted(name: str) -> None:
    f = one(name, "ture")
    assert f.status == FAIL and f.key == name and "'ture'" in f.message and "(environment)" in f.message
    assert ("expected 1, true" in f.message) or ("expected an integer" in f.message)


def test_nothing_set_is_one_ok_line_and_unrelated_variables_are_not_judged() -> None:
    cfg = cfg_for("a3_256die_true_weight")
    assert [f.status for f in vendor_findings({}, cfg)] == [OK]
    s = load_settings({}, None, environ={})
    seen = seen_variables(
        s, {"PRINT_MEMORY": "1", "D2D_DATA_TRANSFER": "1", "LD_PRELOAD": "/lib/libfoo.so", "HOME": "/"}
    )
    assert [f.status for f in vendor_findings(seen, cfg)] == [OK]  # honoured as the vendor's, or not the vendor's


def test_the_env_file_wins_over_the_environment_and_names_its_line(tmp_path: Path) -> None:
    env = tmp_path / "cluster.env"
    env.write_text("NNODES=16\nVLLM_ENABLE_GRAPH_MODE=0\n")
    s = load_settings({}, env, environ={})
    seen = seen_variables(s, {"VLLM_ENABLE_GRAPH_MODE": "1", "VLLM_ENABLE_MC2": "1"})
    assert seen["VLLM_ENABLE_GRAPH_MODE"] == Seen("VLLM_ENABLE_GRAPH_MODE", "0", f"{env}:2")
    assert seen["VLLM_ENABLE_MC2"].where == "environment"
    found = vendor_findings(seen, cfg_for("a3_256die_true_weight"), s.world_size)
    assert [(f.status, f.key) for f in found] == [(FAIL, GRAPH_MODE_KEY), (WARN, "VLLM_ENABLE_MC2")]
    assert f"VLLM_ENABLE_GRAPH_MODE='0' ({env}:2)" in found[0].message


def test_the_tiny_run_is_not_judged_on_world_size() -> None:
    cfg = compose(PROFILES["tiny"].config_name, [], load_settings({}, None, environ={}), ROOT)
    ctx = Context(cfg=cfg, settings=load_settings({}, None, environ={}), root=ROOT, host=HostFacts(device="cpu"))
    assert [f.status for f in vendor_env_findings(ctx, {"WORLD_SIZE": "7"})] == [OK]


def test_the_dry_run_reports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_FIX_ROUTE", "1")
    ctx_cfg = cfg_for("a3_256die_random_init")
    found = run_preflight(ctx_cfg, load_settings({}, None, environ={}), ROOT, HostFacts(device="cpu"))
    vendor = [f for f in found if f.check == CHECK]
    assert [(f.status, f.key) for f in vendor] == [(FAIL, "VLLM_ENABLE_FIX_ROUTE")]


def test_the_launch_refuses_them_before_it_starts_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    refuse_process_starts(monkeypatch, sourced={})
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("VLLM_ENABLE_GRAPH_MODE", "0")
    monkeypatch.setenv("VLLM_ENABLE_MC2", "1")
    iface = next(n for n in job.node_addresses.socket.if_nameindex() if n[1] == "lo")[1]
    rc = job.main(worker_launch(iface))
    err = capsys.readouterr().err
    assert rc == 2
    assert "VLLM_ENABLE_GRAPH_MODE='0' (environment) asks for graph mode off" in err and GRAPH_MODE_KEY in err
    assert "VLLM_ENABLE_MC2" not in err  # a mapped one is said, not refused
