"""`python -m verl_patches.launch.collective_check --env-file cluster.env`: before the long run, every NPU of every
node in one all-reduce and one all-to-all, with the job's own HCCL settings, in minutes instead of a job's start.

Run the same command on every node, as the launch (the head is the node that owns MASTER_ADDR, or NODE_ROLE=head).
The head serves a rendezvous store on MASTER_ADDR:--port (MASTER_PORT by default: free before the job starts),
bound to that address only; each node joins it, and once all NNODES have joined, each starts NPUS_PER_NODE
ranks (`verl_patches.launch.collective_rank`) in the environment the job's processes get (CANN scripts,
HCCL_*, the flight recorder: `job_env`). The head prints one line per node (its ranks, set-up time, bus
bandwidth of both collectives; a node much slower than the others is marked) and a verdict; a node that never
joins, a rank that fails, hangs or receives a wrong value is named with its node. Exit status: 0 pass, 1 a node
or rank failed, 2 bad settings.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from verl_patches.base.node_ip import NetworkError, interface_ipv4, resolve_ipv4
from verl_patches.launch import job_env
from verl_patches.launch.collective_rank import rank_check
from verl_patches.launch.job import base_env, decide_role, source_scripts
from verl_patches.launch.settings import (
    SETTINGS,
    ClusterSettings,
    SettingsError,
    cluster_setting_problems,
    load_settings,
)
from verl_patches.multirank import RankFailure, run_ranks

JOINED, START = "collective_check/joined", "collective_check/start"
SLOW_FACTOR = 2.0  # a node whose collectives take this many times the median node's is marked SLOW
REPORT_SLACK_S = 60.0  # beyond the ranks' deadline, how long the head waits for the other nodes' reports
ABORT_GRACE_S = 3.0  # after an abort, how long the head keeps its store up for the nodes to read why


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.launch.collective_check",
        description="All-reduce and all-to-all over every NPU of every node with the job's HCCL settings; run "
        "the same command on every node before the long run.",
    )
    p.add_argument("--env-file", type=Path, help="the job's KEY=VALUE settings file (cluster.env)")
    p.add_argument("--port", type=int, default=None, help="rendezvous port on MASTER_ADDR (default: MASTER_PORT)")
    p.add_argument("--mib", type=float, default=64.0, help="MiB each rank sends in the timed collectives")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions of each collective (after one warm-up)")
    p.add_argument("--timeout-s", type=float, default=900.0, help="deadline of the ranks, from their start")
    for s in SETTINGS:
        p.add_argument(f"--{s.name.lower().replace('_', '-')}", dest=s.name, metavar=s.name)
    args = p.parse_args(argv)
    if args.mib <= 0 or args.iters < 1 or args.timeout_s <= 0:
        p.error("--mib and --timeout-s must be positive, --iters at least 1")
    return args


def node_environment(settings: ClusterSettings) -> dict[str, str]:
    """What the job's processes get on this node: CANN's scripts, then the job's variables (HCCL_*, ...)."""
    env = base_env()
    scripts = [settings.get("CANN_TOOLKIT_ENV"), settings.get("CANN_NNAL_ENV")]
    env.update(source_scripts([p for p in scripts if p and Path(p).is_file()]))
    variables = job_env.as_dict(job_env.job_environment(settings, 1))
    variables.pop("VLLM_DP_SIZE")  # the rollout's; nothing here reads it
    env.update(variables)
    return env


def serve_store(address: str, port: int, timeout_s: float) -> Any:
    """The rendezvous store, listening on `address` only (torch's own server would bind every interface)."""
    import torch.distributed as dist  # deferred: torch only where a store is made (the summary needs none)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as e:
        sock.close()
        raise SettingsError(
            f"cannot listen on {address}:{port} ({e.strerror}): is the job (its Ray head) still running? "
            f"stop it, or pass --port"
        ) from None
    sock.listen(1024)
    return dist.TCPStore(
        address,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
        master_listen_fd=sock.detach(),  # the store owns the socket from here
        use_libuv=False,  # the libuv server cannot take a bound socket in torch 2.5
    )


def run_local_ranks(npus: int, first_rank: int, world: int, master: str, port: int, args: argparse.Namespace) -> dict:
    """This node's ranks, through the repo's multi-rank harness: each rank's report, or the harness's error."""
    rank_env = [
        {
            "RANK": str(first_rank + r),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(npus),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
        }
        for r in range(npus)
    ]
    kwargs = {
        "master": master,
        "port": port,
        "nbytes": int(args.mib * (1 << 20)),
        "iters": args.iters,
        "timeout_s": 0.8 * args.timeout_s,
    }
    try:
        return {"ranks": run_ranks(rank_check, npus, args.timeout_s, kwargs=kwargs, backend=None, rank_env=rank_env)}
    except RankFailure as e:
        first = str(e).splitlines()[0]
        return {"error": first.replace("rank ", "local rank ")[:2000], "failed_local_ranks": e.ranks}


def _wait_for_nodes(store: Any, nnodes: int, timeout_s: float, say: Any) -> int:
    deadline, last = time.monotonic() + timeout_s, 0.0
    while True:
        joined = 1 + store.add(JOINED, 0)
        if joined >= nnodes or time.monotonic() > deadline:
            return joined
        if time.monotonic() - last > 10:
            say(f"{joined} of {nnodes} nodes joined; waiting up to {deadline - time.monotonic():.0f} s more")
            last = time.monotonic()
        time.sleep(0.5)


def _shape_mismatch(store: Any, nnodes: int, npus: int) -> str | None:
    """A node whose NNODES or NPUS_PER_NODE differs from the head's (its ranks would wait for ranks that never
    come): named, before any rank starts."""
    store.wait([f"collective_check/node/{i}" for i in range(nnodes)], timedelta(seconds=60))
    for i in range(1, nnodes):
        info = _node_info(store, i)
        if (info.get("nnodes"), info.get("npus")) != (nnodes, npus):
            return (
                f"node {i} {info['host']} ({info['ip']}) has NNODES={info.get('nnodes')} "
                f"NPUS_PER_NODE={info.get('npus')}, the head NNODES={nnodes} NPUS_PER_NODE={npus}: "
                f"give every node the same cluster.env"
            )
    return None


def _node_info(store: Any, index: int) -> dict:
    try:
        return json.loads(store.get(f"collective_check/node/{index}"))
    except Exception:  # noqa: BLE001  (a node that never registered)
        return {"host": "?", "ip": "?"}


def summarize(reports: dict[int, dict], nnodes: int, npus: int) -> tuple[bool, list[str]]:
    """(passed, lines): one line per node, a verdict last. Pure: the head's printing is tested through it."""
    lines, ok = [], True
    times = {
        i: max(r["all_reduce_s"] + r["all_to_all_s"] for r in rep["ranks"])
        for i, rep in reports.items()
        if "ranks" in rep
    }
    median = statistics.median(times.values()) if times else 0.0
    for i in range(nnodes):
        rep = reports.get(i)
        first, last = i * npus, (i + 1) * npus - 1
        if rep is None:
            ok = False
            lines.append(f"node {i}: ranks {first}-{last}: FAIL: no report (its check process died, or stopped)")
            continue
        name = f"node {i} {rep['host']} ({rep['ip']})"
        if "ranks" not in rep:
            ok = False
            lines.append(f"{name}: ranks {first}-{last}: FAIL: {rep.get('error', 'no result')}")
            continue
        ranks = rep["ranks"]
        slow = median > 0 and times[i] > SLOW_FACTOR * median
        setup_s = max(r["setup_s"] for r in ranks)
        lines.append(
            f"{name}: ranks {first}-{last}: {'SLOW' if slow else 'ok'}; set-up {setup_s:.1f} s; "
            f"all_reduce {min(r['all_reduce_busbw_gbs'] for r in ranks):.2f}-"
            f"{max(r['all_reduce_busbw_gbs'] for r in ranks):.2f} GB/s bus, "
            f"all_to_all {min(r['all_to_all_busbw_gbs'] for r in ranks):.2f}-"
            f"{max(r['all_to_all_busbw_gbs'] for r in ranks):.2f} GB/s bus"
            + (f" ({times[i] / median:.1f}x the median node's time)" if slow else "")
        )
    any_rank = next((rep["ranks"][0] for rep in reports.values() if rep.get("ranks")), None)
    shape = f"{nnodes * npus} ranks on {nnodes} nodes"
    if any_rank:
        shape += f", {any_rank['backend']}, {any_rank['bytes'] / (1 << 20):g} MiB per rank"
    failed = [ln.split(":")[0] for ln in lines if ": FAIL" in ln]
    lines.append(f"{'PASS' if ok else 'FAIL'} ({shape})" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] collective_check: {msg}", flush=True)

    try:
        flags = {s.name: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name) is not None}
        settings = load_settings(flags, args.env_file)
        problems = cluster_setting_problems(settings, needs_checkpoint=False)
        if problems:
            raise SettingsError("; ".join(p.message for p in problems))
        nnodes, npus = settings.int("NNODES"), settings.int("NPUS_PER_NODE")
        wait_s = float(settings.int("WAIT_TIMEOUT_S"))
        port = args.port or settings.int("MASTER_PORT")
        node_ip = interface_ipv4(settings.get("SOCKET_IFNAME") or "")
        master = resolve_ipv4(settings.get("MASTER_ADDR") or "")
        role = decide_role(settings)
        os.environ.update(node_environment(settings))  # inherited by the ranks, as the job's workers get it
        import torch.distributed as dist  # deferred: after the settings are judged, torch's import takes seconds

        if role == "head":
            store, index = serve_store(master, port, wait_s), 0
        else:
            store = dist.TCPStore(master, port, is_master=False, timeout=timedelta(seconds=wait_s))
            index = store.add(JOINED, 1)
    except (SettingsError, NetworkError) as e:
        print(f"collective_check: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the head's store never answered within WAIT_TIMEOUT_S
        print(f"collective_check: cannot reach the head at {master}:{port}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    if index >= nnodes:
        print(f"collective_check: more than NNODES={nnodes} nodes joined; this node is one too many", file=sys.stderr)
        return 1
    info = {"host": socket.gethostname(), "ip": node_ip, "nnodes": nnodes, "npus": npus}
    store.set(f"collective_check/node/{index}", json.dumps(info))
    say(f"node {index} of {nnodes} ({role}, {socket.gethostname()} {node_ip}); head {master}:{port}")
    if role == "head":
        joined = _wait_for_nodes(store, nnodes, wait_s, say)
        if joined < nnodes:
            hosts = ", ".join(_node_info(store, i)["host"] for i in range(joined))
            msg = f"only {joined} of {nnodes} nodes joined within WAIT_TIMEOUT_S={wait_s:g} s (joined: {hosts})"
            store.set(START, "abort: " + msg)
            print(f"collective_check: FAIL: {msg}", file=sys.stderr)
            time.sleep(ABORT_GRACE_S)  # the store goes with this process: let the nodes that joined read why
            return 1
        differ = _shape_mismatch(store, nnodes, npus)
        if differ:
            store.set(START, "abort: " + differ)
            print(f"collective_check: FAIL: {differ}", file=sys.stderr)
            time.sleep(ABORT_GRACE_S)
            return 1
        store.set(START, "go")
    else:
        try:
            store.wait([START], timedelta(seconds=wait_s))
            start = store.get(START).decode()
        except RuntimeError as e:  # the head went away, or never said go within WAIT_TIMEOUT_S
            print(f"collective_check: no start from the head at {master}:{port}: {e}".splitlines()[0], file=sys.stderr)
            return 1
        if start != "go":
            print(f"collective_check: the head stopped the check: {start}", file=sys.stderr)
            return 1
    say(f"starting {npus} ranks ({index * npus}-{(index + 1) * npus - 1} of {nnodes * npus})")
    ranks_started = time.monotonic()
    result = run_local_ranks(npus, index * npus, nnodes * npus, master, port, args)
    result.update(_node_info(store, index))
    try:
        store.set(f"collective_check/report/{index}", json.dumps(result))
    except RuntimeError as e:  # the head is gone: this node's verdict is still printed here
        say(f"could not report to the head ({str(e).splitlines()[0]})")
    if role != "head":
        say("this node's ranks passed" if "ranks" in result else f"FAIL: {result['error']}")
        return 0 if "ranks" in result else 1
    reports = _collect_reports(store, nnodes, ranks_started + args.timeout_s + REPORT_SLACK_S)
    ok, lines = summarize(reports, nnodes, npus)
    for line in lines:
        say(line)
    return 0 if ok else 1


def _collect_reports(store: Any, nnodes: int, deadline: float) -> dict[int, dict]:
    """Every node's report, waiting until `deadline` (every node's ranks have theirs by then) for the rest."""
    reports: dict[int, dict] = {}
    while len(reports) < nnodes and time.monotonic() < deadline:
        for i in range(nnodes):
            key = f"collective_check/report/{i}"
            if i not in reports and store.check([key]):
                reports[i] = json.loads(store.get(key))
        time.sleep(0.2)
    return reports


if __name__ == "__main__":
    sys.exit(main())
