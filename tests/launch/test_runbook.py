"""The first-day runbook (docs/runbook.md, with the A3 guide it refers to), run as written where a CPU host can:
the smoke run's env file and dry run (data, model and checkpoint folder checked, not "not-checked-here"), the
cluster.env example (MODEL_PATH is make_config.py's output, not the FP8 download; NODES lists NNODES nodes), the
data command with the Python that has pyarrow and its first output line, and the flags of the load pass, the
collective check and the log gathering (each command's own parser accepts them). Only the data paths are replaced
by this test's folders."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

import docs_text
from verl_patches.launch.settings import load_settings, node_list, read_env_file
from verl_patches.weights.config import config_to_json, official_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = docs_text.text()  # README.md and docs/*.md
CLUSTER_VARS = ("MASTER_ADDR", "NNODES", "NODE_ROLE", "MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR")


code_block = docs_text.code_block


def command(block: str, marker: str) -> list[str]:
    line = next(ln for ln in block.splitlines() if marker in ln)
    return shlex.split(line, comments=True)


def env_file_with(block: str, path: Path, **paths: str) -> Path:
    """The documentation's env file block, written to `path` with the named settings pointed at this test's folders."""
    lines = []
    for ln in block.splitlines():
        key = ln.split("=", 1)[0].strip()
        lines.append(f"{key}={paths[key]}" if key in paths else ln)
    path.write_text("\n".join(lines) + "\n")
    return path


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS}


@pytest.fixture
def smoke_inputs(tmp_path):
    """make_config.py's 5-layer folder for the smoke run, and DeepScaleR-format JSON."""
    model = tmp_path / "DeepSeek-V3-smoke"
    model.mkdir()
    cfg = official_config()
    cfg["num_hidden_layers"] = 5
    (model / "config.json").write_text(config_to_json(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text("{}")
    raw = tmp_path / "deepscaler.json"
    raw.write_text(
        json.dumps([{"problem": f"What is {i} + 1?", "answer": str(i + 1), "solution": "."} for i in range(40)])
    )
    return model, raw


@pytest.fixture
def data(tmp_path, smoke_inputs):
    """json_to_parquet's output, made by the converter itself (the documented command is run by its own test)."""
    from verl_patches.data.convert import convert

    convert(smoke_inputs[1], tmp_path / "deepscaler")
    return tmp_path / "deepscaler"


def test_the_data_command_as_written_uses_the_venv_python_and_prints_the_count_first(tmp_path, smoke_inputs):
    convert = command(code_block("json_to_parquet.py --json_path"), "json_to_parquet.py")
    assert convert[0] == ".venv/bin/python"
    convert[convert.index("--json_path") + 1] = str(smoke_inputs[1])
    convert[convert.index("--output_dir") + 1] = str(tmp_path / "out")
    out = subprocess.run(convert, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "rows in: 40 = train 36 + test 4 + rejected 0"
    assert "The first line of its output reads `rows in: N = train T + test E + rejected R`" in DOCS


def test_the_smoke_dry_run_as_written_checks_data_model_and_checkpoint_folder(tmp_path, smoke_inputs, data):
    model = smoke_inputs[0]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    block = code_block("# smoke.env")
    env_file = env_file_with(
        block, tmp_path / "smoke.env", MODEL_PATH=str(model), DATA_DIR=str(data), CKPT_DIR=str(ckpt)
    )
    dry = command(code_block("a3_16die_smoke --env-file smoke.env --dry-run"), "--dry-run")
    assert dry[:4] == ["bash", "verl_patches/scripts/launch_job.sh", "a3_16die_smoke", "--env-file"]
    dry[dry.index("smoke.env")] = str(env_file)
    r = subprocess.run(dry, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    for check in ("data.schema", "model.config", "model.tokenizer", "checkpoint.folder", "checkpoint.resume"):
        assert re.search(rf"^ok +{re.escape(check)} ", r.stdout, re.M), (check, r.stdout[-3000:] + r.stderr)
    assert not re.search(r"^not-checked-here +(data|model)\.", r.stdout, re.M)
    # this host has no room for one 372.66 GB step of the smoke model: the one failure, and the right one
    failures = re.findall(r"^fail +(\S+) +(.*)$", r.stdout, re.M)
    if failures:
        assert r.returncode == 1 and [c for c, _ in failures] == ["checkpoint.storage"], failures
        assert "GB free, needs" in " ".join(r.stdout.split())  # the message wraps in the table
    else:
        assert r.returncode == 0 and "preflight: PASS" in r.stdout


def test_the_cluster_env_example_points_at_make_configs_output_and_lists_every_node(tmp_path):
    block = code_block("# cluster.env")
    values = {k: v for k, (v, _) in read_env_file(env_file_with(block, tmp_path / "cluster.env")).items()}
    fp8 = re.search(r"Download the FP8 checkpoint to `([^`]+)`", DOCS).group(1)
    make_config = command(code_block("make_config.py --from /data/DeepSeek-V3-bf16 --out /data"), "make_config.py")
    assert values["MODEL_PATH"] != fp8
    assert values["MODEL_PATH"] == make_config[make_config.index("--out") + 1]
    settings = load_settings({}, tmp_path / "cluster.env", environ={})
    assert len(node_list(settings)) == int(values["NNODES"])


def test_the_load_pass_flags_are_accepted_at_both_layouts():
    from verl_patches.checks.cli import build_parser, request_from_args
    from verl_patches.checks.run import validate_request

    block = code_block("--mcore /data/dsv3-mcore \\\n  --layers 4 --experts 16")
    args = shlex.split(block.replace("\\\n", " "))[2:]
    req = request_from_args(build_parser().parse_args(args))
    validate_request(req)
    assert (req.layers, req.experts, req.world) == (4, 16, 1)
    smoke = re.search(r"`\.\.\. (--layers 5 --experts 32 [^`]*) \.\.\.`", DOCS).group(1)
    req = request_from_args(build_parser().parse_args(args[:4] + shlex.split(smoke)))
    validate_request(req)
    assert (req.world, req.num_layer_list, req.rollout_tp, req.rollout_ep_size) == (16, (4, 1), 2, 16)


def test_the_collective_check_and_gather_commands_parse(tmp_path):
    from verl_patches.launch.cluster import collective_check, gather_logs

    check = command(code_block("collective_check --env-file cluster.env"), "on_every_node python3")
    assert check[1:4] == ["python3", "-m", "verl_patches.launch.cluster.collective_check"]
    assert collective_check.parse_args(check[4:]).env_file == Path("cluster.env")
    gather = shlex.split(code_block("gather_logs --env-file").replace("\\\n", " "))
    assert gather[:3] == ["python3", "-m", "verl_patches.launch.cluster.gather_logs"]
    args = gather_logs.parse_args(gather[3:])
    assert args.run_dir.endswith("-head-a3-node-01") and args.env_file == Path("cluster.env")


# ---- the fan-out: each node's exit status, node names as data ------------------------------------------

FAKE_SSH = r"""#!/usr/bin/env bash
# ssh as the fan-out calls it: ssh -o BatchMode=yes -- NODE COMMAND; runs COMMAND here, fails for the node "down"
while [ "$1" = -o ]; do shift 2; done
[ "$1" = -- ] && shift
node=$1; shift
printf '%s\n' "$node" >> "$FANOUT_CALLS"
[ "$node" = down ] && { echo "ssh: connect to host down port 22: No route to host" >&2; exit 255; }
exec bash -c "$1"
"""


def on_every_node_definition() -> str:
    block = code_block("on_every_node python3 -m verl_patches.launch.cluster.collective_check")
    start = block.index("on_every_node() {")
    return block[start : block.index("\n}\n", start) + 3]


def run_fanout(tmp_path: Path, nodes: str, command: str, repo: Path) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    script = on_every_node_definition() + '\non_every_node "$FANOUT_COMMAND"\necho "status $?"\n'
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "NODES": nodes,
        "REPO": str(repo),
        "TOKEN": "s3cret",
        "FANOUT_COMMAND": command,
        "FANOUT_CALLS": str(tmp_path / "calls"),
    }
    # NODES, REPO and TOKEN reach the function as the runbook's block sets them, as variables of the shell
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_the_fan_out_reports_each_nodes_exit_status_and_fails_if_one_failed(tmp_path: Path) -> None:
    repo = tmp_path / "repo with space $(touch pwned)"
    repo.mkdir()
    r = run_fanout(tmp_path, "n1 down n3", 'read t; echo "token=$t in $(basename "$PWD")"; exit 3', repo)
    assert r.stdout.splitlines() == ["node n1: exit 3", "node down: exit 255", "node n3: exit 3", "status 1"], r.stderr
    assert (tmp_path / "fanout-n1.log").read_text() == f"token=s3cret in {repo.name}\n"  # the token on stdin, cd'd
    assert "No route to host" in (tmp_path / "fanout-down.log").read_text()
    assert not list(tmp_path.rglob("pwned"))  # REPO is quoted, never run
    ok = run_fanout(tmp_path, "n1 n3", "true", repo)
    assert ok.stdout.splitlines() == ["node n1: exit 0", "node n3: exit 0", "status 0"]


@pytest.mark.parametrize("bad", ["-oProxyCommand=touch${IFS}pwned", "a;touch pwned", "n1/../../x", "*", "$(id)"])
def test_the_fan_out_refuses_a_node_name_that_is_not_one_before_running_anything(tmp_path: Path, bad: str) -> None:
    (tmp_path / "a-file.log").write_text("")  # a glob must not turn into file names
    r = run_fanout(tmp_path, f"n1 {bad}", "touch ran", tmp_path)
    assert r.stdout.splitlines() == ["status 2"]
    assert "is not a host name or address" in r.stderr
    assert not (tmp_path / "calls").exists() and not (tmp_path / "ran").exists()
    assert not list(tmp_path.rglob("pwned"))
