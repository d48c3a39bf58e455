"""The tiny run's launcher turns off torch Inductor's warm compile pool on a CPU host
(`verl_patches.launch.job.no_compile_pool`): with the x86-64 torch wheel (it ships Triton) the first
``torch.compile`` decoration, which Megatron's fusions make at import, pre-starts a compile-worker process in every
process of the job; with TORCH_WARM_POOL=0 it starts none."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_patches.launch.job import no_compile_pool

REPO = Path(__file__).resolve().parents[2]
# decorate a function as Megatron's fusions do, then list this process's children (the warm pool is one of them)
# (polled for a few seconds: the pool may be started from a thread, later on a loaded host)
PROBE = """
import os, time, psutil
os.sched_setaffinity(0, range(os.cpu_count()))  # the pool follows the CPUs a process may use: all of them
import torch
@torch.compile
def f(x):
    return x + 1
deadline = time.monotonic() + 10
while not psutil.Process().children() and time.monotonic() < deadline:
    time.sleep(0.2)
print(len(psutil.Process().children()))
"""


def children_after_compile_decoration(warm_pool: str | None) -> int:
    # a clean environment, not this process's: other tests of the suite set variables (CPU pins, Inductor's)
    # that would decide the pool for the child too
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    if warm_pool is not None:
        env["TORCH_WARM_POOL"] = warm_pool
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return int(out.stdout.split()[-1])


def test_the_launcher_sets_it_off_unless_the_user_chose() -> None:
    assert no_compile_pool({}) == {"TORCH_WARM_POOL": "0"}
    assert no_compile_pool({"TORCH_WARM_POOL": "1"}) == {}  # the user's setting wins
    assert no_compile_pool({"TORCH_WARM_POOL": "0"}) == {}


def test_off_no_process_is_started() -> None:
    assert children_after_compile_decoration("0") == 0


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="torch wheels without Triton (aarch64, A3) never warm the pool"
)
def test_on_the_pool_starts_where_torch_ships_triton() -> None:
    assert children_after_compile_decoration(None) >= 1
