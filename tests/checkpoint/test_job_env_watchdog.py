"""The job environment turns hang diagnosis on, a little before HCCL's own time-out."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_patches.launch.job_env import EnvVar, as_dict, collective_watchdog_timeout, job_environment
from verl_patches.launch.settings import load_settings
from verl_patches.resilience.timeout import TIMEOUT_ENV

CLUSTER = {"MASTER_ADDR": "10.0.0.1", "SOCKET_IFNAME": "enp189s0f0", "JEMALLOC_LIB": "none"}


def test_default_follows_hccl_exec_timeout(tmp_path: Path) -> None:
    d = as_dict(job_environment(load_settings(CLUSTER, None, environ={}), 64))
    assert d[TIMEOUT_ENV] == "540" and d["HCCL_EXEC_TIMEOUT"] == "600"
    env = tmp_path / "cluster.env"
    env.write_text("HCCL_EXEC_TIMEOUT=1200\n")
    d = as_dict(job_environment(load_settings(CLUSTER, env, environ={}), 64))
    assert d[TIMEOUT_ENV] == "1080"
    assert [k for k in d].count(TIMEOUT_ENV) == 1


@pytest.mark.parametrize("value,expected", [("600", "540"), ("10", "30"), ("junk", "540")])
def test_timeout_rule(value: str, expected: str) -> None:
    assert collective_watchdog_timeout([EnvVar("HCCL_EXEC_TIMEOUT", value, "x")]).value == expected
    assert collective_watchdog_timeout([]).value == "540"
