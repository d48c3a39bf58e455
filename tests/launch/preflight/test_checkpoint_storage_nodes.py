"""The launch's check of the checkpoint folder on every node (issue 34 item 1), with fake nodes.

Each fake node is a separate process (`python -m verl_patches.launch.cluster.storage_probe STEP JSON`) that sees the
checkpoint folder through its own view: the same folder for shared storage, a folder of its own for storage
local to that node, a missing folder for a node whose mount is missing. The head's side
(`check_folder_on_nodes`, `checkpoint_nodes.verdict_on_nodes`) must refuse each bad case in one line that names
the node and what to do, and pass the good one leaving nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from fresh_python import fresh_python
from verl_patches.launch.cluster.storage_probe import (
    MARKER_PREFIX,
    check_folder_on_nodes,
    marker_name,
    node_read,
    node_write,
)

ROOT = Path(__file__).resolve().parents[3]
FOLDER = "/shared/ckpt/dsv3"  # the path every node is given; each fake node maps it to its own view
NODES = ["10.0.0.1 (a3-01)", "10.0.0.2 (a3-02)", "10.0.0.3 (a3-03)"]
GIB = 1 << 30


def node_processes(views: Mapping[int, Path]):
    """A NodeCaller that runs each node's step in a process of its own, all at once, on that node's view."""
    calls: list[tuple[str, int]] = []

    def call(step: str, kwargs_by_node: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
        procs = {}
        for i, kwargs in kwargs_by_node.items():
            assert kwargs["folder"] == FOLDER  # the head hands every node the same path
            args = json.dumps({**kwargs, "folder": str(views[i])})
            procs[i] = subprocess.Popen(
                [sys.executable, "-m", "verl_patches.launch.cluster.storage_probe", step, args],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            calls.append((step, i))
        out = {}
        for i, p in procs.items():
            stdout, stderr = p.communicate(timeout=60)
            assert p.returncode == 0, stderr
            out[i] = json.loads(stdout)
        return out

    call.calls = calls  # type: ignore[attr-defined]
    return call


def check(views: Mapping[int, Path], need: int = GIB, wait_s: float = 0.5):
    return check_folder_on_nodes(FOLDER, NODES, node_processes(views), need, "2 kept steps + 1", wait_s=wait_s)


def markers_left(*folders: Path) -> list[str]:
    return [p.name for f in folders if f.is_dir() for p in f.iterdir() if p.name.startswith(MARKER_PREFIX)]


def test_shared_writable_roomy_folder_passes_and_leaves_nothing(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    verdict = check({0: shared, 1: shared, 2: shared})
    assert verdict.ok, verdict.message
    assert "writable from all 3 node(s) and the same storage on all of them" in verdict.message
    assert "\n" not in verdict.message
    assert markers_left(shared) == []


def test_a_node_local_folder_is_refused_naming_the_node(tmp_path: Path) -> None:
    shared, local = tmp_path / "shared", tmp_path / "node3-local-disk"
    shared.mkdir()
    local.mkdir()
    verdict = check({0: shared, 1: shared, 2: local})
    assert not verdict.ok
    msg = verdict.message
    assert "\n" not in msg
    assert "is not the same storage on every node" in msg
    assert "node 10.0.0.3 (a3-03) sees the markers of 1 of 3 node(s) (only its own" in msg
    assert "point it at storage every node mounts" in msg
    assert markers_left(shared, local) == []  # each node removed its own marker


def test_every_node_on_its_own_disk_is_refused(tmp_path: Path) -> None:
    views = {i: tmp_path / f"node{i}" for i in range(3)}
    for v in views.values():
        v.mkdir()
    verdict = check(views)
    assert (
        not verdict.ok
        and "sees the markers of 1 of 3" in verdict.message
        and "(3 node(s) miss some)" in verdict.message
    )


def test_a_folder_missing_on_a_node_is_refused_and_never_created(tmp_path: Path) -> None:
    shared, unmounted = tmp_path / "shared", tmp_path / "mnt-missing" / "ckpt"
    shared.mkdir()
    verdict = check({0: shared, 1: unmounted, 2: shared})
    assert not verdict.ok
    assert verdict.message == (
        f"the checkpoint folder {FOLDER} does not exist on 1 of 3 node(s) (10.0.0.2 (a3-02)): mount the shared "
        f"storage there, or create the folder on it (mkdir -p -m 700 {FOLDER})"
    )
    assert not unmounted.exists()  # a node whose mount is missing must not get a local folder of that name
    assert markers_left(shared) == []  # the nodes that wrote a marker removed it


def test_a_folder_another_account_can_change_on_a_node_is_refused_naming_the_node(tmp_path: Path) -> None:
    """Issue 41 class 4, as each node sees it: the levels above the folder are that node's mounts. Node 3 reaches
    the same storage through a link in a folder its group can write (a member could retarget it)."""
    tmp_path.chmod(0o700)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    node3 = tmp_path / "node3-mnt"
    node3.mkdir()
    node3.chmod(0o775)
    (node3 / "ckpt").symlink_to(shared)
    verdict = check({0: shared, 1: shared, 2: node3 / "ckpt"})
    assert not verdict.ok and "\n" not in verdict.message
    assert verdict.message.startswith(f"the checkpoint folder {FOLDER}: on 1 of 3 node(s) (10.0.0.3 (a3-03)): ")
    assert f"({node3}: writable by group/others and not sticky (mode 775)" in verdict.message
    assert "VERL_PATCHES_ALLOW_SHARED_CKPT_ROOT=1" in verdict.message
    assert markers_left(shared) == []
    shared.chmod(0o770)  # the folder itself, on every node
    verdict = check({0: shared, 1: shared, 2: shared})
    assert not verdict.ok and "on 3 of 3 node(s)" in verdict.message and "(mode 770)" in verdict.message
    accepted = check_folder_on_nodes(
        FOLDER, NODES, node_processes({0: shared, 1: shared, 2: shared}), GIB, "x", wait_s=0.5, allow_shared=True
    )
    assert accepted.ok, accepted.message


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in (as root, permission bits do not stop it)."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
        return folder
    for candidate in (Path("/sys/kernel"), Path("/proc/sys")):
        if candidate.is_dir() and node_write(str(candidate), "probe", 0, "t")["error"]:
            return candidate
    pytest.skip("no folder here refuses file creation to root")


def test_a_folder_not_writable_from_a_node_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    verdict = check({0: shared, 1: shared, 2: unwritable_folder(tmp_path)})
    assert not verdict.ok
    assert "is not writable from 1 of 3 node(s): node 10.0.0.3 (a3-03): cannot create a file in it" in verdict.message
    assert "\n" not in verdict.message
    assert markers_left(shared) == []


def test_too_little_room_is_refused_with_what_it_is_for(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    free = os.statvfs(shared).f_bavail * os.statvfs(shared).f_frsize
    verdict = check({0: shared, 1: shared, 2: shared}, need=free + (1 << 50))
    assert not verdict.ok
    assert (
        "free (node " in verdict.message and "for 2 kept steps + 1; free space there or keep fewer" in verdict.message
    )
    assert markers_left(shared) == []


def test_a_node_that_does_not_answer_is_named(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    inner = node_processes({0: shared, 1: shared, 2: shared})

    def call(step, kwargs_by_node):
        out = inner(step, {i: k for i, k in kwargs_by_node.items() if i != 1})
        return {**out, 1: {"error": "no answer within 180 s (a hung mount?)"}}

    verdict = check_folder_on_nodes(FOLDER, NODES, call, GIB, "x", wait_s=0.2)
    assert not verdict.ok
    assert verdict.message.endswith(
        "node 10.0.0.2 (a3-02) could not be checked: no answer within 180 s (a hung mount?)"
    )
    assert markers_left(shared) == []


def test_a_marker_that_shows_late_is_waited_for(tmp_path: Path) -> None:
    """A network filesystem may show another node's new file only after its attribute cache expires: the
    read round polls by name for a bounded time."""
    folder = tmp_path / "nfs"
    folder.mkdir()
    assert node_write(str(folder), "r1", 0, "tok0")["error"] == ""

    def late() -> None:
        time.sleep(0.4)
        node_write(str(folder), "r1", 1, "tok1")

    t = threading.Thread(target=late)
    t.start()
    got = node_read(str(folder), "r1", {"0": "tok0", "1": "tok1"}, wait_s=5.0, poll_s=0.05)
    t.join()
    assert got == {"seen": [0, 1]}
    # a marker with another token (a stale file, another round) does not count
    (folder / marker_name("r1", 2)).write_text("other")
    assert node_read(str(folder), "r1", {"0": "tok0", "2": "tok2"}, wait_s=0.1, poll_s=0.05) == {"seen": [0]}


RAY_SCRIPT = """
import sys, ray
from verl_patches.launch.cluster.ray_node_calls import cluster_nodes
from verl_patches.launch.cluster.storage_probe import check_folder_on_nodes, run_node_step
ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
address = ray.get_runtime_context().gcs_address
with cluster_nodes(address, run_node_step, timeout_s=60) as (nodes, call):
    for folder in sys.argv[1:]:
        print(check_folder_on_nodes(folder, nodes, call, 1 << 20, "the test").message)
ray.shutdown()
"""


@pytest.mark.slow
def test_the_steps_run_on_every_node_of_a_real_ray_cluster(tmp_path: Path) -> None:
    """The launch's transport: one zero-CPU task pinned to each alive node (here the one node of a local
    cluster) runs the step, importing this module from the repo on PYTHONPATH as the job's Ray nodes do."""
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = fresh_python("-c", RAY_SCRIPT, str(shared), str(tmp_path / "absent"), env=env, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    ok, missing = p.stdout.strip().splitlines()[-2:]
    assert f"{shared}: writable from all 1 node(s)" in ok
    assert "does not exist on 1 of 1 node(s)" in missing
    assert markers_left(shared) == []
