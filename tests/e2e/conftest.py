"""The e2e tests' shared tiny A3-path run: ONE 60-step run of README command 1 per test session serves every
test that needs it (the A3-path checks and golden baseline in test_tiny_grpo.py, the uninterrupted reference
of the faults-and-resume chain, the healthy side of the zero-learning-rate test), so the suite pays for one
tiny run.

That run goes in the background, and the other tiny launches run beside it: a launch leaves one of the two
cores idle for most of its start-up (driver imports, Ray start, task runner imports, rank 0 before the other
ranks; measured about 45 s a launch at half load), and the faults chain waits out its hang time-outs, so two
at once finish the part sooner than one after the other. Nothing compared depends on it: one thread per
process fixes the numbers (verl_patches.base.cpu_numerics), the golden check does not gate step time, and
each job is watched and killed by its own sessions (tiny_job.TinyJob). The run builds the tiny assets
itself, as README command 1 does on a fresh clone; the other launches start once that build is done (the
driver finishes it before it starts Ray). A test takes `tiny_a3_assets` to launch and asks for `a3_run` only
where it compares, so its own launches overlap the run. pytest runs the files in name order: the 10-step
zero-learning-rate launch (test_tiny_fault_golden.py) beside the run first, then the faults chain
(test_tiny_faults_resume.py), whose hang time-outs thus meet the least of the run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from tiny_job import TinyJob, TinyRun, finished_run

A3_RUN_TIMEOUT_S = 2300  # README command 1 beside another launch on a loaded 2-core host
ASSETS_TIMEOUT_S = 1200
# The driver builds the assets (tiny_a3.prepare_for) before verl's run_ppo starts Ray: Ray's line says it is done.
ASSETS_BUILT = r"Started a local Ray instance"


class BackgroundRun:
    """README command 1 running as a background job; `result()` waits for it once."""

    def __init__(self, job: TinyJob, assets: Path) -> None:
        self.job = job
        self.assets = assets
        self._result: TinyRun | None = None

    def assets_built(self) -> Path:
        self.job.wait_for(ASSETS_BUILT, ASSETS_TIMEOUT_S)  # fails with the job's output if it ended first
        return self.assets

    def result(self) -> TinyRun:
        if self._result is None:
            remaining = A3_RUN_TIMEOUT_S - (time.monotonic() - self.job.started)
            self._result = finished_run(self.job, self.job.wait(max(remaining, 1.0)))
        return self._result


@pytest.fixture(scope="session")
def a3_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundRun]:
    """README command 1, as is (60 steps, validation every 20, seed 1), with its own log and assets folders."""
    assets = tmp_path_factory.mktemp("tiny_a3_assets")
    job = TinyJob(tmp_path_factory.mktemp("tiny_logs"), assets, ())
    try:
        yield BackgroundRun(job, assets)
    finally:
        job.close()  # kills it only if a failure left it running


@pytest.fixture(scope="session")
def tiny_a3_assets(a3_job: BackgroundRun) -> Path:
    """The tiny run's assets folder (data, tokenizer, model, converted checkpoint), built by README command 1."""
    return a3_job.assets_built()


@pytest.fixture(scope="session")
def a3_run(a3_job: BackgroundRun) -> TinyRun:
    return a3_job.result()
