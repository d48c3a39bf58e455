"""Is the checkpoint folder one storage that every node can write, with room for the steps kept?

A path that exists on every node is not yet shared storage: each node may have its own local ``/data``, or
the shared mount may be missing on one node while its mount point is an empty local folder. Only what the
nodes see of each other's writes tells. So, in three rounds driven by the head:

1. ``write``: each node checks that the folder exists (it is never created here: a node whose shared
   mount is missing would create a local folder of that name), judges who may change it on that node (the
   save's own rule, `checkpoint.root_access.root_verdict`: the levels above it are that node's mounts),
   creates a marker file in it named by the round and the node's index, holding a random token, and reports
   the free space (``statvfs``);
2. ``read``: each node opens every other node's marker by name and compares its token, waiting a bounded
   time for what a network filesystem's attribute cache has not shown yet;
3. ``clean``: each node removes its own marker.

A node that misses a marker does not see that node's writes: the folder is not the same storage on both.
The per-node steps are plain functions of JSON-able arguments (`run_node_step`), so the head can run them
on every node through Ray (`ray_node_calls`) and a test can run them as separate processes on folders of
its own (`python -m verl_patches.launch.cluster.storage_probe STEP JSON`). Standard library only: the step runs in
a bare Ray worker process on every node.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_patches.checkpoint.root_access import root_verdict

MARKER_PREFIX = ".verl_patches-node-check-"
READ_WAIT_S = 70.0  # NFS caches a folder's attributes up to acdirmax (60 s by default): a new name may lag
POLL_S = 0.5

# (step name, {node index: keyword arguments}) -> {node index: result}; a node that did not answer has a
# result with "error" set
NodeCaller = Callable[[str, Mapping[int, Mapping[str, Any]]], Mapping[int, Mapping[str, Any]]]


def marker_name(round_id: str, index: int) -> str:
    return f"{MARKER_PREFIX}{round_id}-{index}"


def _why(err: OSError) -> str:
    return f"{type(err).__name__}: {err.strerror or err}"


def node_write(folder: str, round_id: str, index: int, token: str, allow_shared: bool = False) -> dict[str, Any]:
    """Round 1 on one node: {"exists", "error", "free_bytes", "access"}; "error" is '' when the marker was
    written, "access" '' when no other account can change the folder there (or the user accepted it:
    ``allow_shared``, the head's reading of VERL_PATCHES_ALLOW_SHARED_CKPT_ROOT), else the refusal line."""
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.lexists(folder) else "does not exist"
        return {"exists": False, "error": what, "free_bytes": 0}
    access = root_verdict(folder, cluster=True, allow_shared=allow_shared).refusal
    try:
        st = os.statvfs(folder)
        free = st.f_bavail * st.f_frsize
    except OSError as err:
        return {"exists": True, "error": f"statvfs failed ({_why(err)})", "free_bytes": 0, "access": access}
    path = os.path.join(folder, marker_name(round_id, index))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, token.encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        return {
            "exists": True,
            "error": f"cannot create a file in it ({_why(err)})",
            "free_bytes": free,
            "access": access,
        }
    return {"exists": True, "error": "", "free_bytes": free, "access": access}


def _read_token(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        return os.read(fd, 256).decode("ascii", "replace")
    finally:
        os.close(fd)


def node_read(
    folder: str, round_id: str, tokens: Mapping[str, str], wait_s: float = READ_WAIT_S, poll_s: float = POLL_S
) -> dict[str, Any]:
    """Round 2 on one node: {"seen": sorted indices whose marker holds its token}. ``tokens`` maps each node's
    index (as a string: JSON keys) to its token. Markers are opened by name, never listed: a listing may be
    served from a cache that a lookup of a new name revalidates."""
    expected = {int(i): t for i, t in tokens.items()}
    seen: set[int] = set()
    deadline = time.monotonic() + max(wait_s, 0.0)
    while True:
        for i, token in expected.items():
            if i not in seen and _read_token(os.path.join(folder, marker_name(round_id, i))) == token:
                seen.add(i)
        if len(seen) == len(expected) or time.monotonic() >= deadline:
            return {"seen": sorted(seen)}
        time.sleep(poll_s)


def node_clean(folder: str, round_id: str, index: int) -> dict[str, Any]:
    """Round 3 on one node: remove its own marker (on storage that is not shared, no other node can)."""
    try:
        os.unlink(os.path.join(folder, marker_name(round_id, index)))
    except FileNotFoundError:
        pass
    except OSError as err:
        return {"error": _why(err)}
    return {"error": ""}


NODE_STEPS: dict[str, Callable[..., dict[str, Any]]] = {"write": node_write, "read": node_read, "clean": node_clean}


def run_node_step(step: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The one entry a node runs (a Ray task, or this module's command line)."""
    if step not in NODE_STEPS:
        raise ValueError(f"unknown storage probe step {step!r} (known: {', '.join(NODE_STEPS)})")
    return NODE_STEPS[step](**kwargs)


# ---- the head's side -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StorageVerdict:
    ok: bool
    message: str  # one line: what was found, or why the folder is refused and what to do


@dataclass
class _Round:
    """One check: the folder, the nodes (names for messages; index = position), the transport, and the
    random round id and per-node tokens that make its markers its own."""

    folder: str
    nodes: list[str]
    call: NodeCaller
    round_id: str = field(default_factory=lambda: secrets.token_hex(8))
    tokens: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = {i: secrets.token_hex(16) for i in range(len(self.nodes))}

    def run(self, step: str, indices: Iterable[int], **extra: Any) -> dict[int, dict[str, Any]]:
        """``step`` on the nodes of ``indices``; a node without an answer gets ``{"error": "no answer"}``."""
        base = {"folder": self.folder, "round_id": self.round_id}
        per_node = {i: {**base, **({"index": i} if step != "read" else {}), **extra} for i in indices}
        if step == "write":
            per_node = {i: {**kw, "token": self.tokens[i]} for i, kw in per_node.items()}
        answers = self.call(step, per_node)
        return {i: dict(answers.get(i) or {"error": "no answer"}) for i in per_node}

    def names(self, indices: Iterable[int], limit: int = 3) -> str:
        shown = [self.nodes[i] for i in indices]
        return ", ".join(shown[:limit]) + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def check_folder_on_nodes(
    folder: str,
    nodes: list[str],
    call: NodeCaller,
    need_bytes: int,
    need_note: str,
    what: str = "the checkpoint folder",
    wait_s: float = READ_WAIT_S,
    human: Callable[[float], str] = lambda n: f"{n / 1e12:.2f} TB",
    allow_shared: bool = False,
) -> StorageVerdict:
    """Run the three rounds on ``nodes`` (names for messages, index = position) through ``call``.

    Refused, in this order: a node that cannot be asked, the folder missing on a node (a mount missing
    there), not writable from a node, another account able to change it on a node (`root_access`;
    ``allow_shared``: the user accepted that by name), not the same storage on every node (a node does not see
    another node's marker), less free space than ``need_bytes`` on some node (``need_note`` says what that room
    is for). Every marker written is removed, whatever the verdict."""
    label = f"{what} {folder}"
    if not nodes:
        return StorageVerdict(False, f"{label}: no node to check it on")
    rnd = _Round(folder, list(nodes), call)
    wrote = rnd.run("write", rnd.tokens, allow_shared=allow_shared)
    written = [i for i, r in wrote.items() if r.get("exists") and not r.get("error")]
    try:
        refused = (
            _write_problem(rnd, label, wrote, written)
            or _access_problem(rnd, label, wrote)
            or _visibility_problem(rnd, label, wait_s)
        )
        if refused:
            return StorageVerdict(False, refused)
        low = min(wrote, key=lambda i: int(wrote[i]["free_bytes"]))
        free = int(wrote[low]["free_bytes"])
        if free < need_bytes:
            return StorageVerdict(
                False,
                f"{label} has {human(free)} free (node {nodes[low]}), needs {human(need_bytes)} for {need_note}; "
                f"free space there or keep fewer steps",
            )
        return StorageVerdict(
            True,
            f"{label}: writable from all {len(nodes)} node(s) and the same storage on all of them (each saw every "
            f"node's marker), {human(free)} free >= {human(need_bytes)} needed for {need_note}",
        )
    finally:
        if written:
            rnd.run("clean", written)


def _write_problem(rnd: _Round, label: str, wrote: Mapping[int, Mapping[str, Any]], written: list[int]) -> str:
    """Why round 1 refuses the folder ('' when every node wrote its marker)."""
    unanswered = [i for i, r in wrote.items() if "exists" not in r]
    if unanswered:
        i = unanswered[0]
        return f"{label}: node {rnd.nodes[i]} could not be checked: {wrote[i].get('error')}"
    absent = [i for i, r in wrote.items() if not r["exists"]]
    if absent:
        return (
            f"{label} {wrote[absent[0]]['error']} on {len(absent)} of {len(rnd.nodes)} node(s) ({rnd.names(absent)}): "
            f"mount the shared storage there, or create the folder on it (mkdir -p -m 700 {rnd.folder})"
        )
    unwritable = [i for i in wrote if i not in written]
    if unwritable:
        i = unwritable[0]
        return (
            f"{label} is not writable from {len(unwritable)} of {len(rnd.nodes)} node(s): node {rnd.nodes[i]}: "
            f"{wrote[i]['error']}; the job's account must be able to create files there on every node"
        )
    return ""


def _access_problem(rnd: _Round, label: str, wrote: Mapping[int, Mapping[str, Any]]) -> str:
    """Why the nodes' view of who may change the folder refuses it ('' when no node found another account
    able to)."""
    refused = [i for i, r in wrote.items() if r.get("access")]
    if not refused:
        return ""
    i = refused[0]
    return f"{label}: on {len(refused)} of {len(rnd.nodes)} node(s) ({rnd.names(refused)}): {wrote[i]['access']}"


def _visibility_problem(rnd: _Round, label: str, wait_s: float) -> str:
    """Why round 2 refuses the folder ('' when every node saw every node's marker)."""
    tokens = {str(i): t for i, t in rnd.tokens.items()}
    seen = rnd.run("read", rnd.tokens, tokens=tokens, wait_s=wait_s)
    blind: list[tuple[int, list[int]]] = []
    for i, got in seen.items():
        if "seen" not in got:
            return f"{label}: node {rnd.nodes[i]} could not read the markers: {got.get('error')}"
        missing = [k for k in rnd.tokens if k not in got["seen"]]
        if missing:
            blind.append((i, missing))
    if not blind:
        return ""
    i, missing = max(blind, key=lambda b: len(b[1]))
    sees = len(rnd.nodes) - len(missing)
    local = " (only its own: a folder local to that node)" if sees == 1 and i not in missing else ""
    return (
        f"{label} is not the same storage on every node: node {rnd.nodes[i]} sees the markers of {sees} of "
        f"{len(rnd.nodes)} node(s){local}, not those of {rnd.names(missing)} ({len(blind)} node(s) miss some); "
        f"point it at storage every node mounts"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m verl_patches.launch.cluster.storage_probe STEP JSON``: run one node step, print its result as
    JSON."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m verl_patches.launch.cluster.storage_probe write|read|clean JSON", file=sys.stderr)
        return 2
    print(json.dumps(run_node_step(args[0], json.loads(args[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
