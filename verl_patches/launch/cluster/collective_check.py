"""`python -m verl_patches.launch.cluster.collective_check --env-file cluster.env --token-stdin`: before the long
run, every NPU of every node in one all-reduce and one all-to-all, with the job's own HCCL settings, in minutes
instead of a job's start.

Run the same command on every node, as the launch (the head is the node that owns MASTER_ADDR, or NODE_ROLE=head;
two check processes on one host, as a CPU test runs them, need ``--node-role worker`` for the second). Every node
gets the same new secret for this check (the token: on stdin with --token-stdin, or in VERL_PATCHES_CHECK_TOKEN;
never on a command line, where other accounts can read it): the head accepts a node's join and report only when
sealed with it (`collective_report`), so a process that ran no rank cannot be reported as a node. The head serves
a rendezvous store on MASTER_ADDR:--port (MASTER_PORT by default: free before the job starts), bound to that
address only; each node joins it, and once all NNODES have joined with the head's NNODES, NPUS_PER_NODE and
backend, the head's signed start message gives every node the size, repetitions and deadline of the check, and
each starts NPUS_PER_NODE ranks (`verl_patches.launch.cluster.collective_rank`) in the environment the job's processes
get (CANN scripts, HCCL_*, the flight recorder: `job_env`). The head prints one line per node (its ranks, set-up
time, bus bandwidth of both collectives, computed from verified times; a node much slower than the others is
marked) and a verdict; a node that never joins, a rank that fails, hangs or receives a wrong value, and a report
that is not sealed or not what the head asked for are named with their node. Exit status: 0 pass, 1 a node or
rank failed, 2 bad settings or flags.
"""

from __future__ import annotations

import argparse
import errno
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from verl_patches.base.finite_float import float_arg
from verl_patches.base.node_ip import NetworkError, interface_ipv4, resolve_ipv4
from verl_patches.base.strict_int import int_arg
from verl_patches.launch import job_env
from verl_patches.launch.cluster.collective_rank import rank_check, timed_elements
from verl_patches.launch.cluster.collective_report import (
    MAX_TOKEN_CHARS,
    TOKEN_ENV,
    Expected,
    NodeInfo,
    NodeOutcome,
    Params,
    Refused,
    check_token,
    node_info,
    node_outcome,
    printable,
    seal,
    shape_problem,
    start_message,
    summarize,
    unseal,
)
from verl_patches.launch.job import base_env, decide_role, source_scripts
from verl_patches.launch.settings import (
    SETTINGS,
    ClusterSettings,
    SettingsError,
    cluster_setting_problems,
    load_settings,
)
from verl_patches.multirank import RankFailure, run_ranks

NONCE, JOINED, START = "collective_check/nonce", "collective_check/joined", "collective_check/start"
REPORT_SLACK_S = 60.0  # beyond the ranks' deadline, how long the head waits for the other nodes' reports
# After the count of joined nodes is full, how long the head waits for their sealed joins: a node writes its join
# right after it is counted, so this only covers a forged join overwritten by the node's own, and a slow host.
REGISTER_WAIT_S = 10.0
ABORT_GRACE_S = 3.0  # after an abort, how long the head keeps its store up for the nodes to read why
POLL_S = 0.2
_ROLE_HELP = "; two check processes on one host (a CPU test) both own MASTER_ADDR: give the second --node-role worker"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.launch.cluster.collective_check",
        usage="python -m verl_patches.launch.cluster.collective_check --env-file FILE [--token-stdin] [options]",
        description="All-reduce and all-to-all over every NPU of every node with the job's HCCL settings; run "
        "the same command on every node before the long run, each given the same new token.",
    )
    p.add_argument("--env-file", type=Path, help="the job's KEY=VALUE settings file (cluster.env)")
    p.add_argument(
        "--token-stdin",
        action="store_true",
        help=f"read this check's token (the secret every node shares for this run) from the first line of stdin; "
        f"else it is taken from {TOKEN_ENV}. Needed when NNODES > 1",
    )
    p.add_argument(
        "--port", type=int_arg(1, 65535), default=None, help="rendezvous port on MASTER_ADDR (default: MASTER_PORT)"
    )
    p.add_argument(
        "--mib", type=float_arg(0, 1 << 16), default=64.0, help="MiB each rank sends in the timed collectives"
    )
    p.add_argument(
        "--iters", type=int_arg(1, 1000), default=5, help="timed repetitions of each collective (after one warm-up)"
    )
    p.add_argument(
        "--timeout-s", type=float_arg(0, 7 * 86400), default=900.0, help="deadline of the ranks, from their start"
    )
    for s in SETTINGS:
        extra = _ROLE_HELP if s.name == "NODE_ROLE" else ""
        p.add_argument(f"--{s.name.lower().replace('_', '-')}", dest=s.name, metavar=s.name, help=s.help + extra)
    return p.parse_args(argv)


def read_token(token_stdin: bool, nnodes: int, stdin: IO[str], environ: dict[str, str]) -> bytes:
    """This check's token (SettingsError when it is missing or no token); with one node and none given, a random
    one: there is no other node to prove anything to."""
    if token_stdin:
        text, where = stdin.readline(MAX_TOKEN_CHARS + 2), "--token-stdin"
    elif environ.get(TOKEN_ENV) is not None:
        text, where = environ[TOKEN_ENV], TOKEN_ENV
    elif nnodes == 1:
        return secrets.token_hex(32).encode()
    else:
        raise SettingsError(
            f"NNODES={nnodes} and no token: the head accepts other nodes' joins and reports only when sealed with "
            f"this check's secret; give every node the same new one on stdin with --token-stdin (docs/runbook.md, "
            f"step 4) or in {TOKEN_ENV}"
        )
    try:
        return check_token(text, where)
    except Refused as e:
        raise SettingsError(str(e)) from None


def node_environment(settings: ClusterSettings) -> dict[str, str]:
    """What the job's processes get on this node: CANN's scripts, then the job's variables (HCCL_*, ...)."""
    env = base_env()
    env.pop(TOKEN_ENV, None)  # the ranks never need the check's secret
    scripts = [settings.get("CANN_TOOLKIT_ENV"), settings.get("CANN_NNAL_ENV")]
    env.update(source_scripts([p for p in scripts if p and Path(p).is_file()]))
    variables = job_env.as_dict(job_env.job_environment(settings, 1))
    variables.pop("VLLM_DP_SIZE")  # the rollout's; nothing here reads it
    env.update(variables)
    return env


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """The socket inodes listening on `port` (any address), from the kernel's tables."""
    inodes = set()
    for table in (proc / "net/tcp", proc / "net/tcp6"):
        try:
            rows = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def held_by_a_check(port: int, proc: Path = Path("/proc")) -> bool:
    """Whether a process this account can see listens on `port` and is a collective_check (its command line)."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    for pid in (p for p in proc.iterdir() if p.name.isdigit()) if wanted else ():
        try:
            if wanted & {os.readlink(fd) for fd in (pid / "fd").iterdir()}:
                return b"verl_patches.launch.cluster.collective_check" in (pid / "cmdline").read_bytes()
        except OSError:  # another account's process, or gone
            continue
    return False


def busy_port_message(address: str, port: int, strerror: str, check_head: bool) -> str:
    """One line naming what holds the port the head needs."""
    if check_head:
        return (
            f"cannot listen on {address}:{port}: another collective_check on this host listens there; this host "
            f"owns {address} (MASTER_ADDR), so a check started here is the head unless given --node-role worker: "
            f"start this host's other node processes with --node-role worker, or stop that check"
        )
    return (
        f"cannot listen on {address}:{port} ({strerror}): another process listens there (while the job runs, "
        f"its Ray head holds MASTER_PORT); stop it, or choose a free port with --port"
    )


def serve_store(address: str, port: int, timeout_s: float) -> Any:
    """The rendezvous store, listening on `address` only (torch's own server would bind every interface)."""
    import torch.distributed as dist  # deferred: torch only where a store is made (the summary needs none)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise SettingsError(busy_port_message(address, port, e.strerror, held_by_a_check(port))) from None
        raise SettingsError(f"cannot listen on {address}:{port} ({e.strerror})") from None
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


def run_local_ranks(npus: int, first_rank: int, world: int, master: str, port: int, params: Params) -> dict:
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
        "nbytes": params.nbytes,
        "iters": params.iters,
        "timeout_s": 0.8 * params.timeout_s,
    }
    try:
        ranks = run_ranks(rank_check, npus, params.timeout_s, kwargs=kwargs, backend=None, rank_env=rank_env)
        return {"ranks": ranks}
    except RankFailure as e:
        first = str(e).splitlines()[0]
        return {"error": first.replace("rank ", "local rank ")[:2000], "failed_local_ranks": e.ranks}


def _wait_for_nodes(store: Any, nnodes: int, timeout_s: float, say: Callable[[str], None]) -> int:
    deadline, last = time.monotonic() + timeout_s, 0.0
    while True:
        joined = 1 + store.add(JOINED, 0)
        if joined >= nnodes or time.monotonic() > deadline:
            return joined
        if time.monotonic() - last > 10:
            say(f"{joined} of {nnodes} nodes joined; waiting up to {deadline - time.monotonic():.0f} s more")
            last = time.monotonic()
        time.sleep(0.5)


def _get(store: Any, key: str) -> bytes | None:
    try:
        return store.get(key) if store.check([key]) else None
    except RuntimeError:
        return None


def sealed_joins(store: Any, token: bytes, nonce: str, count: int) -> dict[int, NodeInfo]:
    """The joins of nodes 1..count-1 that are there now and sealed with the token (no waiting)."""
    infos = {}
    for i in range(1, count):
        raw = _get(store, f"collective_check/node/{i}")
        try:
            infos[i] = node_info(unseal(token, nonce, "node", i, raw or b""), f"join of node {i}")
        except Refused:
            continue
    return infos


def registrations(
    store: Any, token: bytes, nonce: str, head: NodeInfo, wait_s: float
) -> tuple[dict[int, NodeInfo], str | None]:
    """Every other node's sealed join, checked against the head's shape: (infos, None) or (_, why to stop).
    A join that is not sealed with this check's token is waited past (the node may still write its own) until
    `wait_s`, then named."""
    infos: dict[int, NodeInfo] = {}
    refused: dict[int, str] = {}
    deadline = time.monotonic() + wait_s
    while len(infos) < head.nnodes - 1 and time.monotonic() < deadline:
        for i in range(1, head.nnodes):
            raw = None if i in infos else _get(store, f"collective_check/node/{i}")
            if raw is None:
                continue
            what = f"join of node {i}"
            try:
                infos[i] = node_info(unseal(token, nonce, "node", i, raw, what), what)
            except Refused as e:
                refused[i] = str(e)
        time.sleep(POLL_S)
    for i in range(1, head.nnodes):
        if i not in infos:
            why = f"node {i} was counted as joined but never sent its join (not a check process of this run?)"
            return infos, refused.get(i, why)
        problem = shape_problem(i, infos[i], head)
        if problem:
            return infos, problem
    return infos, None


def collect_reports(
    store: Any,
    token: bytes,
    nonce: str,
    infos: dict[int, NodeInfo],
    expected: Callable[[int], Expected],
    deadline: float,
) -> dict[int, NodeOutcome]:
    """Every other node's report, each accepted only when sealed and valid (`node_outcome`); a refused one is
    read again when it changes (the node's own may come after a forged one) until `deadline`, then named."""
    outcomes: dict[int, NodeOutcome] = {}
    refused: dict[int, str] = {}
    seen: dict[int, bytes] = {}
    while len(outcomes) < len(infos) and time.monotonic() < deadline:
        for i, info in infos.items():
            raw = None if i in outcomes else _get(store, f"collective_check/report/{i}")
            if raw is None or raw == seen.get(i):
                continue
            seen[i] = raw
            what = f"report of node {i}"
            try:
                outcomes[i] = node_outcome(unseal(token, nonce, "report", i, raw, what), info, expected(i), what)
            except Refused as e:
                refused[i] = str(e)
        time.sleep(POLL_S)
    for i, why in refused.items():
        if i not in outcomes:
            outcomes[i] = NodeOutcome(infos[i].host, infos[i].ip, error=f"its report was refused: {why}")
    return outcomes


def _wait_start(store: Any, token: bytes, nonce: str, wait_s: float) -> Params | str:
    """The head's sealed start message (its parameters, or why it stopped); a forged one is waited past."""
    deadline, why = time.monotonic() + wait_s, "none came within WAIT_TIMEOUT_S"
    while time.monotonic() < deadline:
        raw = _get(store, START)
        if raw is not None:
            try:
                return start_message(unseal(token, nonce, "start", 0, raw, "the head's start message"))
            except Refused as e:
                why = str(e)
        time.sleep(POLL_S)
    raise RuntimeError(f"no start from the head: {why}")


def _wait_nonce(store: Any, wait_s: float) -> str:
    store.wait([NONCE], timedelta(seconds=wait_s))
    nonce = store.get(NONCE).decode("ascii", "replace")
    if len(nonce) != 32 or not all(c in "0123456789abcdef" for c in nonce):
        raise RuntimeError("the store's nonce is not the head's (32 hex digits)")
    return nonce


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] collective_check: {msg}", flush=True)

    master, port = "?", 0
    try:
        flags = {s.name: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name) is not None}
        settings = load_settings(flags, args.env_file)
        problems = cluster_setting_problems(settings, needs_checkpoint=False)
        if problems:
            raise SettingsError("; ".join(p.message for p in problems))
        nnodes, npus = settings.int("NNODES"), settings.int("NPUS_PER_NODE")
        token = read_token(args.token_stdin, nnodes, sys.stdin, dict(os.environ))
        os.environ.pop(TOKEN_ENV, None)  # read once; no process started from here inherits it
        wait_s = float(settings.int("WAIT_TIMEOUT_S"))
        port = args.port or settings.int("MASTER_PORT")
        node_ip = interface_ipv4(settings.get("SOCKET_IFNAME") or "")
        master = resolve_ipv4(settings.get("MASTER_ADDR") or "")
        role = decide_role(settings)
        os.environ.update(node_environment(settings))  # inherited by the ranks, as the job's workers get it
        # deferred: after the settings are judged, torch's import takes seconds
        import torch.distributed as dist

        from verl_patches.device import device_kind, dist_backend  # deferred: asks torch which device this is

        me = NodeInfo(socket.gethostname(), node_ip, nnodes, npus, dist_backend(device_kind()))
        if role == "head":
            store, index = serve_store(master, port, wait_s), 0
            nonce = secrets.token_hex(16)
            store.set(NONCE, nonce)
        else:
            store = dist.TCPStore(master, port, is_master=False, timeout=timedelta(seconds=wait_s))
            nonce = _wait_nonce(store, wait_s)
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
    say(f"node {index} of {nnodes} ({role}, {me.host} {node_ip}); head {master}:{port}")
    if role == "head":
        return _head(store, token, nonce, me, args, master, port, wait_s, say)
    return _worker(store, token, nonce, me, index, master, port, wait_s, say)


def _abort(store: Any, token: bytes, nonce: str, msg: str) -> int:
    store.set(START, seal(token, nonce, "start", 0, {"abort": msg}))
    print(f"collective_check: FAIL: {msg}", file=sys.stderr)
    time.sleep(ABORT_GRACE_S)  # the store goes with this process: let the nodes that joined read why
    return 1


def _head(
    store: Any,
    token: bytes,
    nonce: str,
    me: NodeInfo,
    args: argparse.Namespace,
    master: str,
    port: int,
    wait_s: float,
    say: Callable[[str], None],
) -> int:
    nnodes, npus, world = me.nnodes, me.npus, me.nnodes * me.npus
    joined = _wait_for_nodes(store, nnodes, wait_s, say)
    if joined < nnodes:
        hosts = ", ".join([me.host, *(i.host for i in sealed_joins(store, token, nonce, joined).values())])
        msg = f"only {joined} of {nnodes} nodes joined within WAIT_TIMEOUT_S={wait_s:g} s (joined: {hosts})"
        return _abort(store, token, nonce, msg)
    infos, problem = registrations(store, token, nonce, me, REGISTER_WAIT_S)
    if problem:
        return _abort(store, token, nonce, problem)
    params = Params(int(args.mib * (1 << 20)), args.iters, args.timeout_s)
    store.set(START, seal(token, nonce, "start", 0, {"go": params.body()}))
    say(f"starting {npus} ranks (0-{npus - 1} of {world})")
    ranks_started = time.monotonic()
    timed_bytes = 4 * timed_elements(params.nbytes, world)

    def expected(i: int) -> Expected:
        return Expected(i * npus, npus, world, me.backend, timed_bytes, params.timeout_s)

    own = run_local_ranks(npus, 0, world, master, port, params)
    try:
        outcomes = {0: node_outcome(own, me, expected(0), "this node's ranks")}
    except Refused as e:
        outcomes = {0: NodeOutcome(me.host, me.ip, error=str(e))}
    outcomes.update(
        collect_reports(store, token, nonce, infos, expected, ranks_started + params.timeout_s + REPORT_SLACK_S)
    )
    ok, lines = summarize(outcomes, nnodes, npus, me.backend, timed_bytes)
    for line in lines:
        say(line)
    return 0 if ok else 1


def _worker(
    store: Any,
    token: bytes,
    nonce: str,
    me: NodeInfo,
    index: int,
    master: str,
    port: int,
    wait_s: float,
    say: Callable[[str], None],
) -> int:
    try:
        store.set(f"collective_check/node/{index}", seal(token, nonce, "node", index, me.body()))
        start = _wait_start(store, token, nonce, wait_s)
    except RuntimeError as e:  # the head went away, or never said go within WAIT_TIMEOUT_S
        print(f"collective_check: {master}:{port}: {printable(str(e).splitlines()[0], 300)}", file=sys.stderr)
        return 1
    if isinstance(start, str):
        print(f"collective_check: the head stopped the check: {start}", file=sys.stderr)
        return 1
    world = me.nnodes * me.npus
    say(f"starting {me.npus} ranks ({index * me.npus}-{(index + 1) * me.npus - 1} of {world})")
    result = run_local_ranks(me.npus, index * me.npus, world, master, port, start)
    try:
        store.set(f"collective_check/report/{index}", seal(token, nonce, "report", index, result))
    except (RuntimeError, ValueError) as e:  # the head is gone: this node's verdict is still printed here
        say(f"could not report to the head ({str(e).splitlines()[0]})")
    say("this node's ranks passed" if "ranks" in result else f"FAIL: {result['error']}")
    return 0 if "ranks" in result else 1


if __name__ == "__main__":
    sys.exit(main())
