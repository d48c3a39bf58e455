"""The launcher's restart loop (`verl_patches.launch.restarts`, `job.run_trainer_restarting`): through the real
launcher (`job.main --tiny --max-restarts N`) with a stand-in trainer that commits real checkpoints
(`checkpoint.commit`) and fails as a run does (a hang report, a SIGKILL, an error), and the loop's own edges
with fakes. The real trainer through a hang and a killed worker is tests/e2e/test_tiny_faults_resume.py."""

from __future__ import annotations

import re
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from verl_patches.launch import job, restarts
from verl_patches.launch.failure_diagnosis import Cause
from verl_patches.launch.restarts import Run, supervise

REPO = Path(__file__).resolve().parents[2]

# A stand-in for the trainer entry: each run reads how many came before it from a state file, resumes where the
# checkpoint root says (its own resume line), commits checkpoints with the real commit code and fails as told.
TRAINER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, @CHECKPOINT_TESTS@)  # the checkpoint tests' helpers, importable as they import each other
    from test_commit import save
    from verl_patches.checkpoint.commit import find_resume
    from verl_patches.resilience.hang_diagnosis import Observed, diagnose, hang_message
    from verl_patches.resilience.progress import Position

    state, ckpt, script = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(";")
    n = int(state.read_text()) if state.exists() else 0
    state.write_text(str(n + 1))
    point = find_resume(ckpt) if ckpt.is_dir() else None
    step = point.step if point else 0
    print(f"verl_patches resume: from {ckpt}/global_step_{step} (step {step}; model, optimizer, RNG and dataloader "
          "restored)" if step else "verl_patches resume: starting from step 0 (no complete checkpoint)", flush=True)
    plan = script[n].split(",")
    for _ in range(int(plan[0])):
        step += 1
        save(ckpt, step)
        print(f"step:{step} - critic/score/mean:0.250", flush=True)
    if plan[1] == "ok":
        sys.exit(0)
    if plan[1] == "hang":
        pos = Position(9, "update_actor", step + 1, "update")
        rec = {"rank": 2, "node": "10.0.0.12", "host": "a3-node-05", "pid": 48202, "log": "", "beat": 3,
               "activity": 0, "pos": pos.to_dict(), "where": ""}
        print(hang_message(diagnose("update_actor", step + 1, [Observed("w2", rec, 30, 30)], 20, 2)), flush=True)
        sys.exit(1)
    if plan[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    print("ValueError: something else", flush=True)
    sys.exit(int(plan[1]))
    """
).replace("@CHECKPOINT_TESTS@", repr(str(REPO / "tests" / "checkpoint")))


def launch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str, *flags: str, save_freq: int = 1
) -> tuple[int, str, list[float], Path]:
    """The launcher with the stand-in trainer: its status, its console, the waits it made, the run folder."""
    trainer, ckpt = tmp_path / "trainer.py", tmp_path / "ckpt"
    trainer.write_text(TRAINER)
    waits: list[float] = []
    monkeypatch.setattr(restarts, "wait", waits.append)
    monkeypatch.setenv(job.SCRIPT_PROFILE_ENV, "a3_256die_random_init")  # as train_*_random_init.sh runs it
    monkeypatch.setattr(
        job,
        "trainer_command",
        lambda _name, _overrides: [sys.executable, str(trainer), str(tmp_path / "state"), str(ckpt), script],
    )
    rc = job.main(
        [
            "--tiny",
            *flags,
            "--log-dir",
            str(tmp_path / "logs"),
            "--",
            f"trainer.save_freq={save_freq}",
            f"trainer.default_local_dir={ckpt}",
        ]  # fmt: skip
    )
    run_dir = next((tmp_path / "logs").glob("tiny-*"))
    return rc, (run_dir / "launcher.log").read_text(), waits, run_dir


def test_a_hang_then_a_kill_are_restarted_and_the_same_step_failing_twice_stops(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rc, out, waits, run_dir = launch(monkeypatch, tmp_path, "2,hang;2,kill;0,kill;0,ok", "--max-restarts", "3")
    assert rc == -signal.SIGKILL
    assert waits == [10, 20]
    lines = [line.split("] ", 1)[1] for line in out.splitlines()]
    assert lines[-1].startswith(
        "stopped restarting: step 5 failed twice (no checkpoint newer than step 4 was committed between the two "
        "failures, so a restart would meet it again); last failure: the trainer being killed by SIGKILL (node "
    ), lines[-1]
    restart_lines = [line for line in lines if line.startswith("restart ")]
    assert restart_lines[0] == (
        "restart 1/3 after a hang of rank 2 (node 10.0.0.12 a3-node-05, pid 48202) in update of step 3; resuming "
        "from step 2 in 10 s"
    )
    assert re.fullmatch(
        r"restart 2/3 after the trainer being killed by SIGKILL \(node \S+, pid \d+\) in step 5; resuming from step 4 "
        r"in 20 s",
        restart_lines[1],
    ), restart_lines
    assert len(restart_lines) == 2
    assert lines[-2] != lines[-1] and sum(line.startswith("verl_patches hang:") for line in lines) == 1
    assert any(
        line.startswith("restarts: up to 3 after a failure, each from the last committed checkpoint") for line in lines
    )
    log = (run_dir / "trainer.log").read_text()  # every run's output, in order, in the one trainer.log
    assert log.count("verl_patches resume:") == 3 and "[launcher] restart 1: the same command again" in log
    assert [int(s) for s in re.findall(r"^step:(\d+)", log, re.M)] == [1, 2, 3, 4]


def test_a_run_that_succeeds_after_a_restart_ends_the_launch_with_status_0(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rc, out, waits, _ = launch(monkeypatch, tmp_path, "1,1;2,ok", "--max-restarts", "1")
    assert rc == 0 and waits == [10]
    assert re.search(
        r"restart 1/1 after the trainer's exit with status 1 \(node \S+, pid \d+\) in step 2: ValueError: something "
        r"else; resuming from step 1 in 10 s",
        out,
    ), out


def test_the_tiny_default_is_no_restart_and_the_failure_is_the_last_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rc, out, waits, _ = launch(monkeypatch, tmp_path, "1,hang;0,ok", save_freq=-1)
    assert rc == 1 and waits == []
    assert out.splitlines()[-1].split("] ", 1)[1].startswith("verl_patches hang: update_actor (step 2)")
    assert "restart" not in out


def test_restarts_without_checkpoints_are_refused_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    trainer_ran = []
    monkeypatch.setenv(job.SCRIPT_PROFILE_ENV, "a3_256die_random_init")
    monkeypatch.setattr(job, "run_logged", lambda *a, **k: trainer_ran.append(a) or 0)
    rc = job.main(["--tiny", "--max-restarts", "2", "--log-dir", str(tmp_path / "logs"), "--", "trainer.save_freq=-1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and not trainer_ran and not (tmp_path / "logs").exists()
    assert err == (
        "launch: --max-restarts 2: trainer.save_freq=-1 writes no checkpoint, so a restart would start over from "
        "step 0 (set trainer.save_freq > 0), or give --max-restarts 0"
    )
    for bad in ("-1", "x", "１"):
        with pytest.raises(SystemExit) as e:
            job.parse_args(["--profile", "a3_16die_smoke", "--max-restarts", bad])
        assert e.value.code == 2


def failing(*codes: int, stopped: bool = False):
    runs = []

    def run(n: int) -> Run:
        runs.append(n)
        return Run(codes[n], "", 100 + n, stopped)

    return run, runs


def cause(run: Run) -> Cause:
    return Cause(f"failure of pid {run.pid}", 7, "stopped on purpose" if run.stopped else "")


def test_a_stop_request_is_never_restarted_nor_a_status_0(capsys: pytest.CaptureFixture) -> None:
    said: list[str] = []
    run, runs = failing(130, stopped=True)
    out = supervise(run, cause, lambda: 5, 3, said.append, sleep=lambda s: None)
    assert out.returncode == 130 and runs == [0]
    assert said == ["not restarting after failure of pid 100: stopped on purpose"] == [out.last_line]
    run, runs = failing(0)
    assert supervise(run, cause, lambda: 5, 3, said.append).returncode == 0 and runs == [0]


def test_ctrl_c_while_waiting_and_an_unreadable_checkpoint_folder_end_the_restarts() -> None:
    said: list[str] = []

    def interrupted(_s: float) -> None:
        raise KeyboardInterrupt

    run, runs = failing(1, 1)
    out = supervise(run, cause, lambda: 5, 3, said.append, sleep=interrupted)
    assert out.returncode == restarts.INTERRUPTED_STATUS and runs == [0]
    assert said[-1] == "stopped while waiting to restart: no restart (the trainer's last status was 1)"

    def unreadable() -> int:
        raise OSError("the root is gone")

    run, runs = failing(1, 1)
    out = supervise(run, cause, unreadable, 3, said.append, sleep=lambda s: None)
    assert runs == [0] and out.last_line == (
        "not restarting after failure of pid 100: the checkpoint folder cannot be read to resume (OSError: the root "
        "is gone)"
    )


def test_the_cluster_waits_for_every_node_before_each_restart() -> None:
    events: list[str] = []
    run, runs = failing(1, 1, 0)
    committed = iter([2, 4])
    out = supervise(
        lambda n: events.append(f"run {n}") or run(n),
        cause,
        lambda: next(committed),
        3,
        lambda line: events.append(line.split(" after")[0]),
        before_restart=lambda: events.append("wait for nodes"),
        sleep=lambda s: events.append(f"sleep {s:g}"),
    )
    assert out.returncode == 0
    assert events == [
        "run 0", "restart 1/3", "sleep 10", "wait for nodes", "run 1", "restart 2/3", "sleep 20", "wait for nodes",
        "run 2",
    ]  # fmt: skip


def test_the_read_back_of_a_runs_output_keeps_its_start_and_end(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "trainer.log"
    log.write_bytes(b"earlier run\n" + b"resume line\n" + b"x" * 5000 + b"\nlast line\n")
    monkeypatch.setattr(restarts, "HEAD_BYTES", 100)
    monkeypatch.setattr(restarts, "TAIL_BYTES", 100)
    text = restarts.read_run_output(log, len(b"earlier run\n"))
    assert text.startswith("resume line\n") and text.endswith("last line\n") and "[...]" in text
    assert len(text) < 250


def test_the_cluster_head_names_a_lost_node_waits_for_every_node_and_keeps_ray_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The head's path with Ray, the preflight and the checkpoint check stood in for (as test_head_launch_path.py):
    a run that fails while Ray marks a node dead is named by that node; the head waits for every node's NPUs again
    before the next run, and stops its Ray node once, at the end."""
    from types import SimpleNamespace

    from verl_patches.launch.cluster import ray_cluster
    from verl_patches.launch.failure_diagnosis import LostNode
    from verl_patches.launch.preflight import checkpoint_nodes
    from verl_patches.launch.preflight import report as preflight

    calls: dict[str, int] = {"wait": 0, "stop": 0}

    class FakeHead:
        pid = __import__("os").getpid()
        process = SimpleNamespace(wait=lambda: 0)
        log_path = tmp_path / "ray.log"

        def alive(self) -> bool:
            return True

        def stop(self) -> None:
            calls["stop"] += 1

    def wait(*_a, **_k) -> None:
        calls["wait"] += 1

    tables = iter([[], [LostNode("10.0.0.9 (node-b)", "health check failed for node")], [], []])
    monkeypatch.setattr(job, "run_preflight", lambda *_a: 0)
    monkeypatch.setattr(job, "source_scripts", lambda _paths: {})
    monkeypatch.setattr(job, "become_subreaper", lambda: False)
    monkeypatch.setattr(ray_cluster, "start_node", lambda *_a, **_k: FakeHead())
    monkeypatch.setattr(ray_cluster, "wait_for_resource", wait)
    monkeypatch.setattr(checkpoint_nodes, "check_on_every_node", lambda *_a: True)
    monkeypatch.setattr(restarts, "dead_nodes", lambda *_a: next(tables))
    monkeypatch.setattr(preflight, "path_environment", lambda *_a: {})
    for var in ("MASTER_ADDR", "NNODES", "NODE_ROLE", "NODES", "MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "logs"))
    trainer, ckpt = tmp_path / "trainer.py", tmp_path / "ckpt"
    trainer.write_text(TRAINER)
    waits: list[float] = []
    monkeypatch.setattr(restarts, "wait", waits.append)
    monkeypatch.setattr(
        job,
        "trainer_command",
        lambda _name, _overrides: [sys.executable, str(trainer), str(tmp_path / "state"), str(ckpt), "2,1;1,ok"],
    )
    rc = job.main(
        ["--profile", "a3_16die_smoke", "--master-addr", "127.0.0.1", "--socket-ifname", "lo",
         "--node-role", "head", "--nnodes", "1", "--", "trainer.save_freq=1", f"trainer.default_local_dir={ckpt}"]
    )  # fmt: skip
    run_dir = next((tmp_path / "logs").glob("a3_16die_smoke-*-head-*"))
    lines = [line.split("] ", 1)[1] for line in (run_dir / "launcher.log").read_text().splitlines()]
    assert rc == 0 and waits == [10]
    assert calls == {"wait": 2, "stop": 1}  # once before the first run, once before the restart; Ray stopped once
    assert "restart 1/3 after the loss of node 10.0.0.9 (node-b) in step 3; Ray: health check failed for node; " \
        "resuming from step 2 in 10 s" in lines  # fmt: skip
    assert lines[-1] == "stopping the Ray processes this launch started"
    assert any(line.startswith("restarts: up to 3 after a failure") for line in lines)  # the cluster's default


def test_restarts_and_ray_only_do_not_mix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    from verl_patches.launch.preflight import report as preflight

    monkeypatch.setattr(preflight, "path_environment", lambda *_a: {})
    monkeypatch.setattr(job, "become_subreaper", lambda: False)
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "logs"))
    rc = job.main(
        ["--profile", "a3_16die_smoke", "--ray-only", "--max-restarts", "2", "--master-addr", "127.0.0.1",
         "--socket-ifname", "lo", "--node-role", "head", "--nnodes", "1", "--", "trainer.save_freq=1",
         f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    )  # fmt: skip
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        "launch: cannot start: --max-restarts 2 with --ray-only: the trainer is then a `ray job submit` of yours, "
        "which this launcher neither runs nor restarts"
    )
