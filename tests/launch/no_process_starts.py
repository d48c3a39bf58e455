"""The launcher run up to its checks with every way it starts a process refused, for the tests of what
`job.main` refuses on a worker node before anything starts."""

from __future__ import annotations

import pytest

from verl_patches.launch import job
from verl_patches.launch.cluster import ray_cluster


def refuse_process_starts(monkeypatch: pytest.MonkeyPatch, *, sourced: dict[str, str] | None = None) -> None:
    """Ray's node start, join and wait, and the logged run, fail the test instead of starting anything; so does
    sourcing the environment scripts, unless ``sourced`` is what it gives instead."""

    def refuse(*_a, **_k):
        raise AssertionError("the launcher tried to start a process")

    for name in ("start_node", "join_with_retries", "wait_for_resource"):
        monkeypatch.setattr(ray_cluster, name, refuse)
    monkeypatch.setattr(job, "run_logged", refuse)
    monkeypatch.setattr(job, "source_scripts", refuse if sourced is None else lambda _paths: sourced)


def worker_launch(socket_ifname: str) -> list[str]:
    """`job.main`'s arguments for a worker node of the A3 random-init profile, its head at 127.0.0.1."""
    profile = ["--profile", "a3_256die_random_init", "--master-addr", "127.0.0.1"]
    return profile + ["--socket-ifname", socket_ifname, "--node-role", "worker"]
