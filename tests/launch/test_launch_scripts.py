"""The user-facing launch scripts (vendor item K1 and its defects): nothing to hand-edit, nothing that
kills processes it did not start, nothing copied into verl/; --help lists every setting; --dry-run passes
on this CPU host with the cluster-only checks marked; a cluster launch without a master address stops
before anything starts, naming MASTER_ADDR."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from no_process_starts import refuse_process_starts, worker_launch
from suite_components import missing_components, require_components
from verl_patches.launch import job
from verl_patches.launch.settings import SETTINGS
from verl_patches.trainer.profiles import CLUSTER_PROFILES, TINY_CONFIGS

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    name: ROOT / "verl_patches" / "scripts" / f"train_deepseekv3_256die_{name}.sh"
    for name in ("true_weight", "random_init")
}
SHELL_FILES = {**SCRIPTS, "launch_job": ROOT / "verl_patches" / "scripts" / "launch_job.sh"}  # + their shared body
LAUNCH_SOURCES = sorted((ROOT / "verl_patches" / "launch").glob("*.py"))
KILLERS = re.compile(r"\bpkill\b|\bkillall\b|\bray\s+stop\b|\bkill\s+-9\b|\bkill\s+-KILL\b|\bsleep\s+9{4,}")
PLACEHOLDERS = re.compile(
    r"IP FOR MASTER|SOCKET IFNAME FOR|your_sharded_weights|\byour_\w+|<[A-Za-z _-]+>|"
    r"\bTODO\b|\bFIXME\b|\bCHANGE ?ME\b|x\.x\.x\.x",
    re.IGNORECASE,
)
CLUSTER_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NNODES",
    "NPUS_PER_NODE",
    "SOCKET_IFNAME",
    "NODE_ROLE",
    "DIST_CKPT_PATH",
    "MODEL_PATH",
    "DATA_DIR",
    "CKPT_DIR",
    "RAY_ADDRESS",
    "LOG_DIR",
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS}
    env.update(extra)
    return env


def run_script(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args], cwd=ROOT, env=clean_env(**env), capture_output=True, text=True, timeout=120
    )


# ---- static checks of the scripts ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHELL_FILES))
def test_script_kills_nothing_and_has_no_placeholder(name: str) -> None:
    text = SHELL_FILES[name].read_text()
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    assert not KILLERS.search(text), KILLERS.search(text)
    assert not PLACEHOLDERS.search(text), PLACEHOLDERS.search(text)
    assert "ifconfig" not in code and "8.8.8.8" not in code
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text


@pytest.mark.parametrize("name", sorted(SHELL_FILES))
def test_script_copies_nothing_into_the_vendored_trees(name: str) -> None:
    code = "\n".join(ln for ln in SHELL_FILES[name].read_text().splitlines() if not ln.lstrip().startswith("#"))
    for verb in ("cp", "mv", "ln", "rsync", "install", "patch", "sed -i", "tee"):
        assert not re.search(rf"(^|[;&|(\s]){re.escape(verb)}\s", code), verb
    assert not re.search(r">\s*\S*(verl|vllm|vllm_ascend|megatron|mindspeed)/", code)


def test_the_two_scripts_differ_only_in_the_profile() -> None:
    tw, ri = (SCRIPTS[n].read_text() for n in ("true_weight", "random_init"))
    assert re.search(r"\bexec\b.*\ba3_256die_true_weight\b", tw) and re.search(
        r"\bexec\b.*\ba3_256die_random_init\b", ri
    )
    norm = lambda s: re.sub(r"true[-_ ]weight|random[-_ ]init", "X", s)  # noqa: E731
    assert norm(tw) == norm(ri)


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings (what the code may execute)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


@pytest.mark.parametrize("path", LAUNCH_SOURCES, ids=lambda p: p.name)
def test_launcher_code_runs_no_global_kill(path: Path) -> None:
    for line, s in _code_strings(path):
        assert not KILLERS.search(s) and s not in ("pkill", "killall"), f"{path.name}:{line}: {s!r}"
        assert s != "stop", f"{path.name}:{line}: a `ray stop`-like command"
        assert "ifconfig" not in s and "8.8.8.8" not in s, f"{path.name}:{line}: {s!r}"


def test_launcher_signals_only_recorded_processes() -> None:
    """Every kill in the launcher targets a process (group) it started itself."""
    for path in LAUNCH_SOURCES:
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("kill", "killpg"):
                target = ast.unparse(n.args[0])
                assert target in ("proc.pid", "pgid"), f"{path.name}:{n.lineno}: signals {target}"


# ---- --help and --dry-run ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_lists_every_setting(name: str) -> None:
    p = run_script(SCRIPTS[name], "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: {SCRIPTS[name].name}")
    for s in SETTINGS:
        assert f"--{s.name.lower().replace('_', '-')}" in p.stdout, s.name
        assert re.search(rf"^\s+{s.name}\s+\S", p.stdout, re.MULTILINE), s.name
    for flag in ("--env-file", "--dry-run", "--tiny"):
        assert flag in p.stdout


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_dry_run_passes_on_this_cpu_host(name: str, tmp_path: Path) -> None:
    # CKPT_DIR: the A3 profiles' checkpoint folder has no default (a cluster's, not on this host)
    p = run_script(SCRIPTS[name], "--dry-run", LOG_DIR=str(tmp_path / "logs"), CKPT_DIR="/shared/ckpt/dsv3")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert re.search(r"preflight: PASS \(\d+ ok, \d+ warn, [1-9]\d* not-checked-here, 0 fail\)", out), out[-500:]
    not_checked = [ln for ln in out.splitlines() if ln.startswith("not-checked-here")]
    checks = {ln.split()[1] for ln in not_checked}
    cluster_only = {
        "cluster.master_addr",
        "cluster.socket_ifname",
        "cluster.npu_count",
        "cluster.torch_npu",
        "cluster.cann_env",
        "cluster.ports_free",
        "data.files",
        "model.config",
        "checkpoint.storage",  # the checkpoint folder: on the cluster's storage, checked on the nodes
        "checkpoint.nodes",
        "checkpoint.resume",
    }
    if name == "true_weight":
        cluster_only.add("checkpoint.dist")  # the random-init run loads no checkpoint
    assert cluster_only <= checks, cluster_only - checks
    assert ("checkpoint.dist" in checks) == (name == "true_weight")
    for check in ("layout.world_size", "memory.training", "memory.rollout", "sources.verl", "patches"):
        assert re.search(rf"^ok\s+{re.escape(check)}\s", out, re.MULTILINE), check
    # checkpointing and validation are on, with their cost (issue 34)
    assert re.search(r"^ok\s+checkpoint\.cadence\s+a step saved every 10 steps", out, re.MULTILINE)
    assert re.search(r"^ok\s+validation\s+validation before training and every 10 steps", out, re.MULTILINE)
    assert not (tmp_path / "logs").exists()  # a dry run starts nothing and writes no run directory
    assert "Traceback" not in p.stderr


def test_tiny_dry_run_is_the_fast_local_path(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    p = run_script(SCRIPTS["random_init"], "--tiny", "--dry-run", "--", f"overlay.tiny_assets_dir={assets}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "preflight of ppo_tiny_local" in p.stdout and "preflight: PASS" in p.stdout
    # nothing on a local run depends on a cluster; only a git-only component absent from this host (no git,
    # no exported cache) is reported as not checked here, by name
    absent = missing_components()
    assert f"{len(absent)} not-checked-here" in p.stdout
    for name in absent:
        assert re.search(rf"^not-checked-here\s+sources\.{name}\s", p.stdout, re.MULTILINE), name
    assert not assets.exists()  # a dry run builds nothing
    require_components(*absent)  # passes where everything is installed; skipped with the reason (failed in CI)


def test_unknown_option_is_rejected() -> None:
    p = run_script(SCRIPTS["true_weight"], "--master-adress", "10.0.0.1")
    assert p.returncode == 2 and "--master-adress" in p.stderr


# ---- cluster launch refused before anything starts --------------------------------------------------


@pytest.fixture
def nothing_may_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    refuse_process_starts(monkeypatch)
    for var in CLUSTER_VARS:
        monkeypatch.delenv(var, raising=False)
    logs = tmp_path / "logs"
    monkeypatch.setenv("LOG_DIR", str(logs))
    return logs


def test_unknown_socket_interface_exits_1_naming_it(nothing_may_start: Path, capsys: pytest.CaptureFixture) -> None:
    rc = job.main(worker_launch("nonexistent0"))
    err = capsys.readouterr().err
    assert rc == 1
    assert "SOCKET_IFNAME='nonexistent0'" in err and "no such interface" in err and "Traceback" not in err
    assert not nothing_may_start.exists()


@pytest.mark.parametrize("role", ["head", "worker", "auto"])
def test_cluster_launch_without_master_addr_exits_2_naming_it(
    nothing_may_start: Path, role: str, capsys: pytest.CaptureFixture
) -> None:
    rc = job.main(["--profile", "a3_256die_random_init", "--socket-ifname", "lo", "--node-role", role])
    err = capsys.readouterr().err
    assert rc == 2
    assert "MASTER_ADDR is not set" in err and "Traceback" not in err
    assert not nothing_may_start.exists()


def test_placeholder_master_addr_from_env_file_exits_2(
    nothing_may_start: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    env_file = tmp_path / "cluster.env"
    env_file.write_text('SOCKET_IFNAME=lo\nMASTER_ADDR="IP FOR MASTER NODE"\nDIST_CKPT_PATH=/ckpt\n')
    rc = job.main(["--profile", "a3_256die_true_weight", "--env-file", str(env_file), "--node-role", "head"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "MASTER_ADDR='IP FOR MASTER NODE'" in err and f"{env_file}:2" in err
    assert not nothing_may_start.exists()


def test_every_cluster_problem_is_reported_at_once(nothing_may_start: Path, capsys: pytest.CaptureFixture) -> None:
    rc = job.main(["--profile", "a3_256die_true_weight", "--nnodes", "0"])
    err = capsys.readouterr().err
    assert rc == 2
    for name in ("MASTER_ADDR", "NNODES", "SOCKET_IFNAME", "DIST_CKPT_PATH"):
        assert f"  - {name}" in err, name


def test_env_file_error_exits_2_with_file_and_line(
    nothing_may_start: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    env_file = tmp_path / "cluster.env"
    env_file.write_text("MASTER_ADDR=10.0.0.1\nMASTR_PORT=1\n")
    rc = job.main(["--profile", "a3_256die_true_weight", "--env-file", str(env_file)])
    assert rc == 2 and f"{env_file}:2" in capsys.readouterr().err


def test_job_overrides_put_the_user_last() -> None:
    args = job.parse_args(["--profile", "a3_256die_true_weight", "--", "trainer.nnodes=2", "data.train_batch_size=64"])
    from verl_patches.launch.settings import load_settings

    s = load_settings({"NNODES": "4", "NPUS_PER_NODE": "8"}, None, environ={})
    assert job.job_overrides(args, s) == [
        "profile=a3_256die_true_weight",
        "trainer.nnodes=4",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=2",
        "data.train_batch_size=64",
    ]
    assert job.trainer_command("ppo_mindspeed_trainer", ["a=1"]) == [
        sys.executable,
        "-m",
        "verl_patches.trainer.main_ppo_npu",
        "--config-name",
        "ppo_mindspeed_trainer",
        "a=1",
    ]
    # a tiny config runs the CPU proof's entry: the trainer entry with the tiny assets built first
    for name in TINY_CONFIGS.values():
        assert job.trainer_command(name, ["a=1"])[1:5] == [
            "-m",
            "verl_patches.cpu_proof.main_tiny",
            "--config-name",
            name,
        ]


# ---- --help of every entry point, and the profile a script runs --------------------------------------------

LAUNCH_JOB = SHELL_FILES["launch_job"]
SETUP_CPU_ENV = ROOT / "verl_patches" / "scripts" / "setup_cpu_env.sh"


def test_launch_job_help_exits_0_naming_every_profile() -> None:
    for flag in ("--help", "-h"):
        p = run_script(LAUNCH_JOB, flag)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert p.stdout.startswith("usage: bash verl_patches/scripts/launch_job.sh PROFILE ")
        profiles = re.search(r"PROFILE: (.*)", p.stdout).group(1)
        assert set(re.findall(r"\w+", profiles)) - {"or"} == set(CLUSTER_PROFILES)
    p = run_script(LAUNCH_JOB)  # no profile: the usage, as an error
    assert p.returncode == 2 and p.stderr.startswith("usage: ") and p.stdout == ""


def test_launch_job_refuses_an_unknown_profile_in_one_line(tmp_path: Path) -> None:
    p = run_script(LAUNCH_JOB, "a3_nope", "--dry-run", LOG_DIR=str(tmp_path / "logs"))
    assert p.returncode == 2 and p.stderr.strip() == (
        "launch_job.sh a3_nope: unknown profile 'a3_nope'; one of " + ", ".join(sorted(CLUSTER_PROFILES))
    )
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_help_shows_its_profile_as_fixed_not_required(name: str) -> None:
    p = run_script(SCRIPTS[name], "--help")
    assert p.returncode == 0, p.stderr
    usage = p.stdout.split("\n\n", 1)[0]
    assert re.search(r"\[--profile \{", usage), usage  # optional: the script supplies it
    profile = f"a3_256die_{name}"
    options = " ".join(p.stdout.split())
    assert (
        f"--profile {{{','.join(sorted(CLUSTER_PROFILES))}}} {profile} (this script's; another profile is refused"
        in options
    )


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_profile_that_contradicts_the_script_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    p = run_script(SCRIPTS[name], "--profile", "a3_16die_smoke", "--dry-run", LOG_DIR=str(tmp_path / "logs"))
    (line,) = p.stderr.strip().splitlines()
    assert p.returncode == 2 and p.stdout == ""
    assert line == (
        f"{SCRIPTS[name].name}: runs profile a3_256die_{name}; --profile a3_16die_smoke contradicts it "
        "(for that profile: bash verl_patches/scripts/launch_job.sh a3_16die_smoke ...)"
    )
    assert not (tmp_path / "logs").exists()  # nothing ran, not even the preflight


def test_the_scripts_profile_is_the_default_and_naming_it_again_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(job.SCRIPT_PROFILE_ENV, "a3_256die_random_init")
    assert job.parse_args([]).profile == "a3_256die_random_init"
    assert job.parse_args(["--profile", "a3_256die_random_init"]).profile == "a3_256die_random_init"
    with pytest.raises(SystemExit) as e:
        job.parse_args(["--profile", "a3_256die_true_weight"])
    assert e.value.code == 2
    monkeypatch.delenv(job.SCRIPT_PROFILE_ENV)
    with pytest.raises(SystemExit):  # run directly, the launcher still needs --profile
        job.parse_args([])


def test_setup_cpu_env_help_prints_usage_and_sets_nothing_up(tmp_path: Path) -> None:
    # PYTHON names a program that does not exist: had the set-up started, it would fail on it
    p = run_script(SETUP_CPU_ENV, "--help", PYTHON=str(tmp_path / "no-python"))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.startswith("usage: bash verl_patches/scripts/setup_cpu_env.sh")
    assert "requirements.txt" in p.stdout and "==" not in p.stdout  # its header, not the set-up's first step
    p = run_script(SETUP_CPU_ENV, "--frobnicate", PYTHON=str(tmp_path / "no-python"))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == "setup_cpu_env: unknown argument --frobnicate (it takes none; see --help)"
