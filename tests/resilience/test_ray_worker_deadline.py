"""The driver's bounded wait through a real verl RayWorkerGroup (`ray_group_driver.py`: three workers on a
private local Ray cluster, our patches in the driver and the workers): a worker SIGSTOPped in the middle of
its micro-batches is named by the driver (rank, node, pid, phase, step, micro-batch) one time-out after its
last progress, the call fails with that line and every worker process of the group is gone (the stopped
one included); a worker that dies is named at once; a slow but live worker is waited for.

The three cases run one after the other in one driver and one Ray cluster (a module fixture), each with a
group of its own started after the previous group is gone: what each test checks is its own group's call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("ray_group_driver.py")
TIMEOUT_S = 6.0
SLACK_S = 5.0

pytestmark = [pytest.mark.slow, pytest.mark.multiproc, pytest.mark.timeout(600)]  # the first test runs all three


MODES = ("frozen", "dies", "peers_fail", "slow")


def run(*modes: str) -> dict[str, dict]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "VERL_PATCHES_COLLECTIVE_TIMEOUT_S": str(TIMEOUT_S),
        "VERL_PATCHES_QUIET": "1",
        "RAY_DEDUP_LOGS": "0",
    }
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run(
        [sys.executable, str(DRIVER), *modes], cwd=REPO, env=env, capture_output=True, text=True, timeout=560
    )
    results = [json.loads(out[len("RESULT ") :]) for out in p.stdout.splitlines() if out.startswith("RESULT ")]
    assert [r["mode"] for r in results] == list(modes), (p.stdout[-3000:], p.stderr[-3000:])
    return {r["mode"]: r for r in results}


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    return run(*MODES)


def test_a_frozen_worker_is_named_and_the_group_is_ended(results: dict[str, dict]) -> None:
    out = results["frozen"]
    assert out["patched"] == "verl_patches.resilience.worker_deadline"
    err, pid = out.get("error", ""), out["pids"][1]
    assert err.startswith("WorkerHangError: verl_patches hang: work (step 7) made no progress for "), out
    assert "stuck: rank 1 (node " in err and f", pid {pid}) stopped reporting " in err
    assert (
        "(process frozen or dead), last in phase 'update' (micro-batch 2/4 of batch 1) of step 7 in update_actor" in err
    )
    assert TIMEOUT_S <= out["elapsed"] <= 0.6 + TIMEOUT_S + SLACK_S, out["elapsed"]  # two micro-batches, then T
    assert out["alive_after"] == [], out  # ray.kill ended the stopped process too


def test_a_worker_that_dies_is_named_at_once(results: dict[str, dict]) -> None:
    out = results["dies"]
    err = out.get("error", "")
    assert err.startswith("WorkerHangError: verl_patches hang: work (step 7): worker process died: rank 1 (node "), out
    assert f"pid {out['pids'][1]}) last in phase 'update' (micro-batch 2/4 of batch 1) of step 7" in err
    assert out["elapsed"] < TIMEOUT_S, out["elapsed"]


def test_a_death_that_makes_the_peers_fail_first_is_named_as_the_cause(results: dict[str, dict]) -> None:
    out = results["peers_fail"]
    err = out.get("error", "")
    assert err.startswith("WorkerHangError: verl_patches hang: work (step 7): worker process died: rank 1 (node "), out
    assert f"pid {out['pids'][1]}) last in phase 'update' (micro-batch 2/4 of batch 1) of step 7" in err
    assert "2 other worker(s) failed after it: " in err and "Connection reset" in err, err
    assert out["elapsed"] < 1.0 + 0.6 + SLACK_S, out["elapsed"]  # the death, not the grace's end


def test_a_slow_but_live_worker_is_waited_for(results: dict[str, dict]) -> None:
    out = results["slow"]
    assert "error" not in out, out
    assert sorted(out["result"]) == sorted(out["pids"])
    assert out["elapsed"] > 2 * TIMEOUT_S  # four micro-batches of 0.7 time-out on rank 1
