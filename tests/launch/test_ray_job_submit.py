"""The `ray job submit` route (issue 42, item 5) against a real Ray head: a head started as the launcher starts it
(`ray start --head --block` on 127.0.0.1, free ports, the launcher's environment, the repo as working directory),
then README's submit command with the trainer entry's dry check (`verl_patches.trainer.cluster_check`) as the
entrypoint and a runtime env that sets one of the variables ours forwards too (Ray refuses such a merge unless the
driver gives way). The job's driver joins the running cluster (no Ray of its own), our prelude is active in the
driver and in a worker that got it only through the setup hook, and the cluster is still up when the job ends."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

import docs_text
from verl_patches.base.free_port import free_port
from verl_patches.launch import job
from verl_patches.launch.cluster.ray_cluster import head_command, start_node

ROOT = Path(__file__).resolve().parents[2]
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]


def dashboard_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def ray_tmp(monkeypatch: pytest.MonkeyPatch):
    tmp = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield Path(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_job_submit_runs_the_trainer_entry_with_the_prelude_in_driver_and_worker(ray_tmp: Path) -> None:
    port, dash = free_port(), free_port()
    cmd = head_command("127.0.0.1", port, 2, "NPU", "127.0.0.1", dash, num_cpus=1)
    cmd += [f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}"]
    env = job.base_env()  # the launcher's: the repo and the vLLM metadata on PYTHONPATH
    env["VERL_PATCHES_QUIET"] = "1"
    cwd = os.getcwd()
    os.chdir(ROOT)  # the launch script runs the launcher, and so `ray start`, in the repo
    try:
        head = start_node(cmd, "head", ray_tmp / "ray.log", env, address=f"127.0.0.1:{port}")
    finally:
        os.chdir(cwd)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 120
        while not dashboard_up(url):
            assert head.alive(), (ray_tmp / "ray.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the dashboard did not come up"
            time.sleep(1)
        # README's command, with this venv's Python for python3 and a runtime env that sets a variable ours forwards
        entry = [sys.executable, "-m", "verl_patches.trainer.cluster_check", "--timeout-s", "120"]
        runtime = json.dumps({"env_vars": {"VERL_PATCHES_QUIET": "1"}})
        submit = RAY_CLI + ["job", "submit", "--submission-id", "check-1", "--runtime-env-json", runtime, "--"]
        client_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_ADDRESS": url}
        r = subprocess.run(submit + entry, env=client_env, capture_output=True, text=True, timeout=240)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        assert "Job 'check-1' succeeded" in out, out[-4000:]
        driver = next(ln for ln in out.splitlines() if ln.startswith("cluster_check: driver "))
        assert "prelude active" in driver and driver.endswith(f":{port}"), driver  # RAY_ADDRESS: our head's GCS
        workers = [ln for ln in out.splitlines() if ln.startswith("cluster_check: node ")]
        assert len(workers) == 1 and "prelude active" in workers[0], out[-4000:]
        worker_pid = int(workers[0].split("worker pid ")[1].split()[0])
        driver_pid = int(driver.split("driver pid ")[1].split()[0])
        assert worker_pid != driver_pid
        assert "cluster_check: PASS: the prelude is active in the driver and in a worker on each of 1 node(s)" in out
        # the job joined our cluster and left it running
        assert head.alive()
        status = subprocess.run(
            RAY_CLI + ["job", "status", "check-1"], env=client_env, capture_output=True, text=True, timeout=60
        )
        assert "Job 'check-1' succeeded" in status.stdout + status.stderr
    finally:
        head.stop(grace_s=20)
    assert not head.alive()


def test_cluster_check_refuses_to_run_without_a_cluster(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from verl_patches.trainer import cluster_check

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_check.main([]) == 2
    assert "RAY_ADDRESS is not set" in capsys.readouterr().err


def test_the_docs_give_the_submit_stop_and_logs_commands() -> None:
    lines = [ln.strip() for ln in docs_text.text().splitlines()]
    submit = next(ln for ln in lines if ln.startswith("ray job submit ") and "main_ppo_npu" in ln)
    argv = shlex.split(submit.replace("\\", ""))
    assert "--address" not in argv or argv[argv.index("--address") + 1].startswith("http://127.0.0.1:")
    tail = argv[argv.index("--") + 1 :]
    assert tail[:3] == ["python3", "-m", "verl_patches.trainer.main_ppo_npu"]
    check = next(ln for ln in lines if ln.startswith("ray job submit ") and "cluster_check" in ln)
    assert shlex.split(check)[-3:] == ["python3", "-m", "verl_patches.trainer.cluster_check"]
    assert any(ln.startswith("ray job stop ") for ln in lines) and any(ln.startswith("ray job logs ") for ln in lines)
