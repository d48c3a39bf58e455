"""The head's launch path around Ray (issue 42, items 4 and 5), with Ray, the preflight and the checkpoint check stood
in for: the head hands NODES (looked up) to the wait so that it names the missing nodes, records itself and its Ray
node in pids.json, and with --ray-only holds the cluster for `ray job submit` (printing the command with the launch's
own overrides and the stop command) instead of running the trainer, then stops the Ray node it started."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl_patches.launch import job
from verl_patches.launch.cluster import node_roster, ray_cluster
from verl_patches.launch.preflight import checkpoint_nodes
from verl_patches.launch.preflight import report as preflight


@pytest.fixture
def head_launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    calls: dict[str, object] = {}

    def refuse(*_a, **_k):
        raise AssertionError("the trainer must not run with --ray-only")

    class FakeHead:
        pid = os.getpid()  # a live process, so pids.json records it by start time
        process = SimpleNamespace(wait=lambda: (_ for _ in ()).throw(KeyboardInterrupt()))  # Ctrl-C while held
        log_path = tmp_path / "ray.log"

        def alive(self) -> bool:
            return True

        def stop(self) -> None:
            calls["stopped"] = True

    def wait(*args, **kwargs):
        calls["wait"] = (args, kwargs)

    monkeypatch.setattr(job, "run_preflight", lambda *_a: 0)
    monkeypatch.setattr(job, "source_scripts", lambda _paths: {})
    monkeypatch.setattr(job, "run_logged", refuse)
    monkeypatch.setattr(job, "become_subreaper", lambda: False)
    monkeypatch.setattr(ray_cluster, "start_node", lambda *_a, **_k: FakeHead())
    monkeypatch.setattr(ray_cluster, "wait_for_resource", wait)
    monkeypatch.setattr(checkpoint_nodes, "check_on_every_node", lambda *_a: True)
    monkeypatch.setattr(node_roster, "_lookup", lambda entry: {"node-b": ["10.0.0.2"]}.get(entry, []))
    for var in ("MASTER_ADDR", "NNODES", "NODE_ROLE", "NODES", "MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(preflight, "path_environment", lambda *_a: {})
    return calls


def test_ray_only_holds_the_cluster_prints_submit_and_stop_and_names_nodes(head_launch, tmp_path, capsys) -> None:
    rc = job.main(
        [
            "--profile", "a3_16die_smoke", "--ray-only", "--master-addr", "127.0.0.1", "--socket-ifname", "lo",
            "--node-role", "head", "--nnodes", "2", "--nodes", "127.0.0.1,node-b", "--",
            "trainer.total_training_steps=5",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 130 and head_launch["stopped"] is True
    args, kwargs = head_launch["wait"]
    assert args[1:4] == ("NPU", 32.0, 2) and kwargs["per_node"] == 16.0
    assert [(n.entry, sorted(n.names)) for n in kwargs["nodes"]] == [
        ("127.0.0.1", ["127.0.0.1"]),
        ("node-b", ["10.0.0.2", "node-b"]),
    ]
    submit = next(ln for ln in out.splitlines() if "submit the trainer from this node: " in ln)
    argv = shlex.split(submit.split("submit the trainer from this node: ", 1)[1])
    assert argv[:7] == ["ray", "job", "submit", "--address", "http://127.0.0.1:8260", "--no-wait", "--"]
    assert argv[7:12] == [
        "python3",
        "-m",
        "verl_patches.trainer.main_ppo_npu",
        "--config-name",
        "ppo_mindspeed_trainer",
    ]
    assert argv[12:] == [
        "profile=a3_16die_smoke",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=16",
        "trainer.total_training_steps=5",
    ]
    stop_line = next(ln for ln in out.splitlines() if "stop the cluster with: " in ln)
    run_dir = Path(shlex.split(stop_line.split("stop the cluster with: ", 1)[1])[-1])
    recorded = json.loads((run_dir / "pids.json").read_text())["processes"]
    assert {n: e["pid"] for n, e in recorded.items()} == {"launcher": os.getpid(), "ray": os.getpid()}


def test_without_nodes_the_wait_gets_none(head_launch, capsys) -> None:
    job.main(
        ["--profile", "a3_16die_smoke", "--ray-only", "--master-addr", "127.0.0.1", "--socket-ifname", "lo",
         "--node-role", "head", "--nnodes", "1"]
    )  # fmt: skip
    assert head_launch["wait"][1]["nodes"] == ()  # no NODES: the wait counts nodes, it cannot name them


def test_a_stop_while_the_nodes_join_ends_in_one_line_with_the_head_stopped(
    head_launch, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`launch.cluster.stop RUN_DIR` (SIGINT) on a head still waiting for NPUs: the Ray node it started is stopped
    and the launcher ends with one line and status 130, not a KeyboardInterrupt traceback."""

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_cluster, "wait_for_resource", interrupted)
    rc = job.main(
        ["--profile", "a3_16die_smoke", "--master-addr", "127.0.0.1", "--socket-ifname", "lo",
         "--node-role", "head", "--nnodes", "2"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 130 and head_launch["stopped"] is True
    assert "stopping the Ray processes this launch started" in captured.out
    assert captured.err.strip().splitlines()[-1] == "launch: stopped by SIGINT (Ctrl-C or launch.cluster.stop)"
    assert "Traceback" not in captured.err + captured.out


def test_a_stop_while_a_worker_joins_ends_the_node_it_started(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The worker's join retries `ray start` until the head answers; a stop between two tries must not leave the
    last one running (the launcher records a node only once it joined)."""
    stopped = []
    node = SimpleNamespace(stop=lambda: stopped.append(True), alive=lambda: True)
    monkeypatch.setattr(ray_cluster, "start_node", lambda *_a, **_k: node)

    def sleep(_s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_cluster.time, "sleep", sleep)
    with pytest.raises(KeyboardInterrupt):
        ray_cluster.join_with_retries(["ray", "start"], tmp_path / "ray.log", 60.0, progress=lambda _l: None)
    assert stopped == [True]
