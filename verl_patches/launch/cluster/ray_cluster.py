"""Start and stop exactly the Ray processes this launch owns.

`ray start --block` runs in the foreground of a new process session that we record; Ray's daemons are
its children and die with it. Stopping therefore signals only that session: never `ray stop` (which
stops every Ray on the node) and never a kill by process name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_patches.launch.cluster.node_roster import (
    ExpectedNode,
    RayNodeRow,
    Sighting,
    missing_text,
    observe,
    rows_from_ray,
)
from verl_patches.launch.run_dir import open_new
from verl_patches.process_identity import (
    ProcessId,
    children_of,
    descendants,
    is_subreaper,
    reap_dead_children,
    signal_if_same,
    start_ticks,
)

RAY = [sys.executable, "-m", "ray.scripts.scripts"]
# Ports Ray hands out by itself on every node, at its defaults (neither launch changes them): the client
# server (10001) and the worker ports (10002-19999). A port we plan must not lie in them: Ray can take it first.
# (The GCS and dashboard ports are ours: MASTER_PORT and RAY_DASHBOARD_PORT on a cluster; the tiny run's local
# Ray takes a port from the kernel for its GCS and starts no dashboard.)
RAY_OWN_PORTS: dict[str, tuple[int, int]] = {"Ray's client server and worker ports": (10001, 19999)}


class RayClusterError(RuntimeError):
    pass


@dataclass
class RayNode:
    """A `ray start --block` process we started, with its own session (process group)."""

    process: subprocess.Popen
    role: str
    log_path: Path
    address: str = ""  # host:port of the GCS for a head

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float = 20.0, leftover_grace_s: float = 3.0) -> None:
        pgid = self.pid  # start_new_session: the leader's pid is the group id, even after the leader exited
        leader_exited = True
        if self.process.poll() is None:
            # SIGTERM to `ray start --block` alone: it drains the node and stops its own daemons in a few
            # seconds. Signalling the whole group at once kills the GCS first, and the drain then waits
            # for it until Ray's 30 s timeout, so every stop ended in SIGKILL after the full grace.
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                leader_exited = False
        if _group_alive(pgid):
            # After a graceful leader, what is left are the raylet's helper agents (dashboard agent, runtime
            # env agent), which Ray leaves to notice their parent's death; the runtime env agent at times
            # ignores SIGTERM for over 20 s. They hold no state, so they get a short grace. A leader that
            # ignored SIGTERM keeps the full one for its daemons.
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.time() + (min(grace_s, leftover_grace_s) if leader_exited else grace_s)
            while time.time() < deadline and _group_alive(pgid):
                time.sleep(0.2)
            if _group_alive(pgid):
                _signal_group(pgid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(10)
        deadline = time.time() + 5.0  # killed processes linger (zombies) until reaped; return once they are gone
        while time.time() < deadline and _group_present(pgid):
            reap_dead_children([p for p in children_of(os.getpid()) if _pgid(p) == pgid])  # the leader was waited
            time.sleep(0.1)
        if self.role == "head" and self.address:
            forget_current_cluster(self.address)


def _current_cluster_file() -> Path:
    """Where `ray start --head` on this node records its address (Ray honours RAY_TMPDIR / TMPDIR)."""
    for module in ("ray._common.utils", "ray._private.utils"):  # moved between Ray 2.46 and 2.60
        try:
            return Path(__import__(module, fromlist=["get_ray_address_file"]).get_ray_address_file(None))
        except (ImportError, AttributeError):
            continue
    return Path("/tmp/ray/ray_current_cluster")


def _as_recorded(address: str) -> str:
    """The address as `ray start` records it: a loopback --node-ip-address becomes the node's routable IP."""
    host, _, port = address.rpartition(":")
    try:
        # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
        from ray._private.services import resolve_ip_for_localhost

        return f"{resolve_ip_for_localhost(host)}:{port}"
    except Exception:  # noqa: BLE001  (best effort: the literal address is still compared)
        return address


def forget_current_cluster(address: str, marker: Path | None = None) -> None:
    """`ray start --head` records its address for later `ray.init()` calls to join; once our head is
    gone that record would send the next local run to a dead cluster. Remove it only if it is ours."""
    marker = _current_cluster_file() if marker is None else marker
    try:
        if marker.read_text().strip() in {address, _as_recorded(address)}:
            marker.unlink()
    except OSError:
        pass


def group_members(pgid: int) -> list[ProcessId]:
    """The live processes of the node's process group that this process started: its descendants in that
    group (a subreaper launcher keeps orphaned daemons as descendants). A process that only carries the
    number (a later group that reused it) is never one of them. Without subreaping (a test calling this
    directly), orphans are found by group id and a start no earlier than the group leader's."""
    mine = [d for d in descendants(os.getpid()) if _pgid(d.pid) == pgid]
    if is_subreaper():
        return mine
    leader = start_ticks(pgid)
    seen = {d.pid for d in mine}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in seen and _pgid(int(name)) == pgid:
            ident = ProcessId.of(int(name))
            if ident is not None and (leader is None or ident.started >= leader) and ident.alive():
                mine.append(ident)
    return mine


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _signal_group(pgid: int, sig: int) -> None:
    for member in group_members(pgid):
        signal_if_same(member.pid, member.started, sig)


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def _group_present(pgid: int) -> bool:
    """Any process, zombies included, still carries the group id (signal 0 sends nothing)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def head_command(
    node_ip: str,
    port: int,
    npus: int,
    resource: str,
    dashboard_host: str,
    dashboard_port: int,
    num_cpus: int | None = None,
) -> list[str]:
    cmd = RAY + [
        "start",
        "--head",
        "--block",
        f"--node-ip-address={node_ip}",
        f"--port={port}",
        f"--dashboard-host={dashboard_host}",
        f"--dashboard-port={dashboard_port}",
        f"--resources={json.dumps({resource: npus})}",
        "--num-gpus=0",
        "--disable-usage-stats",
    ]
    return cmd + ([f"--num-cpus={num_cpus}"] if num_cpus else [])


def worker_command(address: str, node_ip: str, npus: int, resource: str, num_cpus: int | None = None) -> list[str]:
    cmd = RAY + [
        "start",
        "--block",
        f"--address={address}",
        f"--node-ip-address={node_ip}",
        f"--resources={json.dumps({resource: npus})}",
        "--num-gpus=0",
        "--disable-usage-stats",
    ]
    return cmd + ([f"--num-cpus={num_cpus}"] if num_cpus else [])


def start_node(
    cmd: list[str], role: str, log_path: Path, env: dict[str, str] | None = None, address: str = ""
) -> RayNode:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open_new(log_path) if not log_path.exists() else open(log_path, "ab")  # the launch's own: never a link
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
    )
    log.close()
    return RayNode(proc, role, log_path, address)


def node_rows(address: str, resource: str) -> list[RayNodeRow]:
    """Ray's node table as the head's GCS reports it (live and dead nodes), with each node's `resource`."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray

    if not ray.is_initialized():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return rows_from_ray(ray.nodes(), resource)


def cluster_resource(address: str, resource: str) -> tuple[float, int]:
    """(total of `resource`, number of alive nodes) as the head's GCS reports them."""
    live = [r for r in node_rows(address, resource) if r.alive]
    return sum(r.npus for r in live), len(live)


def _port_open(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


REPORT_EVERY_S = 60.0  # an unchanged progress line is repeated this often, so a quiet wait still shows it is alive
LINE_NODES = 6  # missing nodes named in one progress line; the time-out error names them all


def wait_for_resource(
    address: str,
    resource: str,
    expected: float,
    expected_nodes: int,
    timeout_s: float,
    head: RayNode | None = None,
    progress: Callable[[str], None] = print,
    poll_s: float = 5.0,
    nodes: Sequence[ExpectedNode] = (),
    per_node: float | None = None,
    report_s: float = REPORT_EVERY_S,
) -> None:
    """Block until the cluster offers `expected` of `resource`, printing a progress line; else raise.

    With `nodes` (NODES, looked up by `node_roster.expected_nodes`) each line names the nodes that have not
    joined and what the head last saw of each (never seen, joined with too few NPUs, left at a time), and the
    time-out error names every one of them. The line is printed when it changes and every `report_s`."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray

    per_node = per_node if per_node is not None else expected / max(expected_nodes, 1)
    start = time.time()
    last, last_at = "", 0.0
    seen: dict[str, Sighting] = {}
    view = observe(nodes, [], per_node, start)
    try:
        while True:
            if head is not None and not head.alive():
                raise RayClusterError(f"the Ray head exited (see {head.log_path})")
            rows: list[RayNodeRow] | None
            try:
                # ray.init blocks for minutes on a GCS that is not listening (a head still starting, or
                # one that died): connect only once the port answers, so the loop keeps its progress
                # line, its timeout and its check of the head.
                rows = node_rows(address, resource) if ray.is_initialized() or _port_open(address) else []
            except (ConnectionError, RuntimeError, ray.exceptions.RpcError):
                rows = None  # the table could not be read: what was seen before stands
            now = time.time()
            if rows is not None:
                view = observe(nodes, rows, per_node, now, seen)
                seen = view.sightings
            live = [r for r in rows or [] if r.alive]
            have, joined = sum(r.npus for r in live), len(live)
            state = f"waiting for {resource}s: {have:g}/{expected:g} on {joined}/{expected_nodes} nodes"
            named = missing_text(view, per_node, LINE_NODES) if nodes and have < expected else ""
            key = state + named
            if key != last or now - last_at >= report_s:
                progress(f"{state} ({now - start:.0f} s of {timeout_s:.0f} s)" + (f"; {named}" if named else ""))
                last, last_at = key, now
            if have >= expected:
                return
            if now - start > timeout_s:
                if nodes:
                    who = missing_text(view, per_node) or "every node of NODES joined, with fewer NPUs than expected"
                else:
                    joined_nodes = ", ".join(r.label() for r in live) or "none"
                    who = f"joined: {joined_nodes} (set NODES in the env file to have the missing nodes named)"
                raise RayClusterError(
                    f"only {have:g} of {expected:g} {resource}s joined within {timeout_s:.0f} s "
                    f"({joined}/{expected_nodes} nodes): {who}; start the launch script on the missing "
                    f"nodes, or raise WAIT_TIMEOUT_S"
                )
            time.sleep(poll_s)
    finally:
        if ray.is_initialized():
            ray.shutdown()


def join_with_retries(
    cmd: list[str],
    log_path: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    progress: Callable[[str], None] = print,
    retry_s: float = 10.0,
) -> RayNode:
    """Start a worker node; while the head is not up yet `ray start` fails fast, so retry until timeout."""
    start = time.time()
    attempt = 0
    while True:
        attempt += 1
        node = start_node(cmd, "worker", log_path, env)
        try:
            time.sleep(min(retry_s, 15.0))
        except KeyboardInterrupt:  # stopped while joining: the caller has not recorded this node, so end it here
            node.stop()
            raise
        if node.alive():
            progress(f"joined the Ray cluster (attempt {attempt})")
            return node
        if time.time() - start > timeout_s:
            raise RayClusterError(
                f"could not join the Ray head after {attempt} attempts in {timeout_s:.0f} s (see {log_path})"
            )
        progress(f"the Ray head is not reachable yet (attempt {attempt}); retrying")
