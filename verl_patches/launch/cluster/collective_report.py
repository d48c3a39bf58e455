"""What the nodes of a collective check tell each other, and how each message is proven and read.

Every message between the nodes' check processes travels through the head's rendezvous store, which anyone who
reaches its port can read and write (torch's TCPStore has no authentication). So each message is sealed: an
HMAC-SHA256, keyed with the check's token (a secret every node's check process gets on stdin or from its
environment, never on a command line, never sent), over the run's nonce (fresh at each head start: a message
of an earlier check does not replay), the message's kind, the node index it speaks for and its JSON body. A
message whose seal does not verify (`hmac.compare_digest`) is refused unread, and a verified one is still
checked field by field (types, ranges, exactly the ranks of its node, the backend and size the head asked for)
before anything in it is shown: a node that ran no rank cannot appear as ``ok``, and no report sets what the
verdict line says about the check. Bandwidths are computed here from the verified times, never taken from a
report. Everything in this module is pure.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from verl_patches.launch.cluster.collective_rank import bus_bandwidth_gbs

PROTOCOL = "verl_patches collective_check 1"
TOKEN_ENV = "VERL_PATCHES_CHECK_TOKEN"
MIN_TOKEN_CHARS, MAX_TOKEN_CHARS = 32, 512
MAX_MESSAGE_BYTES = 1 << 20  # a node of 16 ranks reports ~3 KB
MAX_TEXT = 2000  # characters of a node's error shown
MAX_NPUS = 4096
BACKENDS = ("hccl", "gloo", "nccl")
SLOW_FACTOR = 2.0  # a node whose collectives take this many times the median node's is marked SLOW
RANK_KEYS = frozenset({"rank", "host", "device", "backend", "setup_s", "bytes", "all_reduce_s", "all_to_all_s"})


class Refused(ValueError):
    """A message (or a token) that is not accepted; the message is one line saying why."""


def check_token(text: str, where: str) -> bytes:
    """The check's token as HMAC key: MIN..MAX_TOKEN_CHARS printable ASCII characters without spaces."""
    text = text.strip("\r\n")
    if not MIN_TOKEN_CHARS <= len(text) <= MAX_TOKEN_CHARS or not all("!" <= c <= "~" for c in text):
        raise Refused(
            f"{where}: the check's token must be {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} printable ASCII characters "
            f"without spaces (got {len(text)} characters); make one with "
            "python3 -c 'import secrets; print(secrets.token_hex(32))'"
        )
    return text.encode("ascii")


def strict_json(data: bytes | str, what: str) -> Any:
    """JSON without NaN/Infinity, bounded in size and depth; Refused otherwise."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise Refused(f"{what}: {len(data)} bytes, more than {MAX_MESSAGE_BYTES}")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        return json.loads(data, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:
        raise Refused(f"{what}: not JSON ({str(e)[:80]})") from None


def _signed(nonce: str, kind: str, index: int, body: str) -> bytes:
    return "\0".join((PROTOCOL, nonce, kind, str(index), body)).encode()


def seal(token: bytes, nonce: str, kind: str, index: int, body: dict) -> bytes:
    """`body` as a message of `kind` for node `index`, sealed with the token for this run (`nonce`)."""
    text = json.dumps(body, allow_nan=False, separators=(",", ":"))
    mac = hmac.new(token, _signed(nonce, kind, index, text), hashlib.sha256).hexdigest()
    return json.dumps({"kind": kind, "index": index, "body": text, "mac": mac}).encode()


def unseal(token: bytes, nonce: str, kind: str, index: int, raw: bytes, what: str = "") -> dict:
    """The body of a sealed message, only if it is the `kind` message of node `index` for this run, sealed
    with this check's token; Refused (naming the message as `what`) otherwise. Nothing of a message is parsed
    past its envelope before its seal is verified."""
    what = what or f"{kind} message of node {index}"
    env = strict_json(raw, what)
    if not isinstance(env, dict) or set(env) != {"kind", "index", "body", "mac"}:
        raise Refused(f"{what}: not a sealed message of this check")
    if not all(isinstance(env[k], str) for k in ("kind", "body", "mac")) or type(env["index"]) is not int:
        raise Refused(f"{what}: not a sealed message of this check")
    if (env["kind"], env["index"]) != (kind, index):
        raise Refused(f"{what}: sealed for another message or node, not this one")
    want = hmac.new(token, _signed(nonce, kind, index, env["body"]), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want.encode(), env["mac"].encode("ascii", "replace")):
        raise Refused(
            f"{what}: not sealed with this check's token for this run (a process that was not started for this "
            "check, or a node given another token)"
        )
    body = strict_json(env["body"], what)
    if not isinstance(body, dict):
        raise Refused(f"{what}: its body is not a JSON object")
    return body


def printable(text: str, limit: int = MAX_TEXT) -> str:
    """Text from another node as one printable line (controls and terminal escapes shown escaped)."""
    out = "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else repr(c)[1:-1] for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


def _int(body: dict, key: str, low: int, high: int, what: str) -> int:
    value = body.get(key)
    if type(value) is not int or not low <= value <= high:
        raise Refused(f"{what}: {key} must be an integer in {low}..{high}, got {printable(repr(value), 40)}")
    return value


def _seconds(body: dict, key: str, low: float, high: float, what: str, *, above: bool = False) -> float:
    value = body.get(key)
    number = type(value) in (int, float) and abs(value) <= 1e300  # a 400-digit integer is no float
    if not number or not math.isfinite(value) or not (low < value if above else low <= value) or value > high:
        shown = printable(repr(value), 40)
        raise Refused(f"{what}: {key} must be a finite number of seconds in {low:g}..{high:g}, got {shown}")
    return float(value)


def _text(body: dict, key: str, what: str, limit: int = 255) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= limit or not value.isprintable():
        raise Refused(f"{what}: {key} must be printable text of 1 to {limit} characters")
    return value


@dataclass(frozen=True)
class NodeInfo:
    """What a node says of itself when it joins: checked against the head's own settings before any rank starts."""

    host: str
    ip: str
    nnodes: int
    npus: int
    backend: str

    def body(self) -> dict:
        return {"host": self.host, "ip": self.ip, "nnodes": self.nnodes, "npus": self.npus, "backend": self.backend}


def node_info(body: dict, what: str) -> NodeInfo:
    if set(body) != {"host", "ip", "nnodes", "npus", "backend"}:
        raise Refused(f"{what}: expected the keys host, ip, nnodes, npus, backend")
    ip = _text(body, "ip", what, 15)
    try:
        ipaddress.IPv4Address(ip)
    except ValueError:
        raise Refused(f"{what}: ip must be an IPv4 address, got {printable(ip, 40)}") from None
    backend = _text(body, "backend", what, 16)
    if backend not in BACKENDS:
        raise Refused(f"{what}: backend must be one of {', '.join(BACKENDS)}, got {printable(backend, 40)}")
    return NodeInfo(
        _text(body, "host", what),
        ip,
        _int(body, "nnodes", 1, 65536, what),
        _int(body, "npus", 1, MAX_NPUS, what),
        backend,
    )


def shape_problem(index: int, info: NodeInfo, head: NodeInfo) -> str | None:
    """Why node `index` cannot run with the head's ranks (its ranks would wait for ranks that never come)."""
    if (info.nnodes, info.npus) != (head.nnodes, head.npus):
        return (
            f"node {index} {info.host} ({info.ip}) has NNODES={info.nnodes} NPUS_PER_NODE={info.npus}, the head "
            f"NNODES={head.nnodes} NPUS_PER_NODE={head.npus}: give every node the same cluster.env"
        )
    if info.backend != head.backend:
        return f"node {index} {info.host} ({info.ip}) would run {info.backend}, the head {head.backend}"
    return None


@dataclass(frozen=True)
class Params:
    """What the head asks every rank to do: the start message carries it, so every node times the same."""

    nbytes: int
    iters: int
    timeout_s: float

    def body(self) -> dict:
        return {"nbytes": self.nbytes, "iters": self.iters, "timeout_s": self.timeout_s}


def start_message(body: dict) -> Params | str:
    """The head's start message: the parameters of the check, or (a str) why it stopped the check."""
    what = "the head's start message"
    if set(body) == {"abort"} and isinstance(body["abort"], str):
        return printable(body["abort"])
    go = body.get("go") if set(body) == {"go"} else None
    if not isinstance(go, dict) or set(go) != {"nbytes", "iters", "timeout_s"}:
        raise Refused(f"{what}: expected go (nbytes, iters, timeout_s) or abort")
    return Params(
        _int(go, "nbytes", 1, 1 << 36, what),
        _int(go, "iters", 1, 1000, what),
        _seconds(go, "timeout_s", 0, 7 * 86400, what, above=True),
    )


@dataclass(frozen=True)
class Expected:
    """What node `index`'s report must say, from the head's own settings (never from any report)."""

    first_rank: int
    npus: int
    world: int
    backend: str
    timed_bytes: int  # what each rank moves in the timed collectives (collective_rank.timed_elements x 4)
    timeout_s: float


@dataclass(frozen=True)
class RankResult:
    rank: int
    host: str
    device: str
    setup_s: float
    all_reduce_s: float
    all_to_all_s: float


@dataclass(frozen=True)
class NodeOutcome:
    """A node's result as the head accepted it: its verified ranks, or why it failed."""

    host: str
    ip: str
    ranks: tuple[RankResult, ...] = ()
    error: str = ""


def rank_result(body: Any, expected: Expected, what: str) -> RankResult:
    if not isinstance(body, dict) or set(body) != RANK_KEYS:
        raise Refused(f"{what}: a rank's result must have exactly the keys {', '.join(sorted(RANK_KEYS))}")
    rank = _int(body, "rank", expected.first_rank, expected.first_rank + expected.npus - 1, what)
    if body["backend"] != expected.backend:
        raise Refused(
            f"{what}: rank {rank} ran {printable(str(body['backend']), 16)}, the head asked for {expected.backend}"
        )
    if body["bytes"] != expected.timed_bytes or type(body["bytes"]) is not int:
        raise Refused(
            f"{what}: rank {rank} timed {printable(repr(body['bytes']), 24)} bytes, "
            f"the head asked for {expected.timed_bytes}"
        )
    limit = expected.timeout_s
    return RankResult(
        rank,
        _text(body, "host", what),
        _text(body, "device", what, 64),
        _seconds(body, "setup_s", 0, limit, what),
        _seconds(body, "all_reduce_s", 0, limit, what, above=True),
        _seconds(body, "all_to_all_s", 0, limit, what, above=True),
    )


def node_outcome(body: dict, info: NodeInfo, expected: Expected, what: str) -> NodeOutcome:
    """A node's report (its ranks' results, or its error) checked against what the head asked; Refused when
    any field is not what it must be."""
    if set(body) == {"ranks"}:
        ranks = body["ranks"]
        if not isinstance(ranks, list) or len(ranks) != expected.npus:
            raise Refused(f"{what}: ranks must list the results of its {expected.npus} ranks")
        results = tuple(rank_result(r, expected, what) for r in ranks)
        want = list(range(expected.first_rank, expected.first_rank + expected.npus))
        if sorted(r.rank for r in results) != want:
            raise Refused(f"{what}: ranks must be {want[0]}-{want[-1]}, each once")
        return NodeOutcome(info.host, info.ip, tuple(sorted(results, key=lambda r: r.rank)))
    if set(body) == {"error", "failed_local_ranks"} and isinstance(body["error"], str):
        failed = body["failed_local_ranks"]
        if not isinstance(failed, list) or not all(type(r) is int and 0 <= r < expected.npus for r in failed):
            raise Refused(f"{what}: failed_local_ranks must list local ranks 0..{expected.npus - 1}")
        return NodeOutcome(info.host, info.ip, error=printable(body["error"]) or "no message")
    raise Refused(f"{what}: expected ranks, or error and failed_local_ranks")


def summarize(
    outcomes: dict[int, NodeOutcome], nnodes: int, npus: int, backend: str, timed_bytes: int
) -> tuple[bool, list[str]]:
    """(passed, lines): one line per node, a verdict last; what the verdict says of the check (backend, size)
    is what the head asked for. Bandwidths are computed here from the verified times."""
    world = nnodes * npus
    lines, ok = [], True
    times = {i: max(r.all_reduce_s + r.all_to_all_s for r in o.ranks) for i, o in outcomes.items() if o.ranks}
    median = statistics.median(times.values()) if times else 0.0
    for i in range(nnodes):
        o = outcomes.get(i)
        first, last = i * npus, (i + 1) * npus - 1
        if o is None:
            ok = False
            lines.append(f"node {i}: ranks {first}-{last}: FAIL: no report (its check process died, or stopped)")
            continue
        name = f"node {i} {o.host} ({o.ip})"
        if not o.ranks:
            ok = False
            lines.append(f"{name}: ranks {first}-{last}: FAIL: {o.error or 'no result'}")
            continue
        slow = median > 0 and times[i] > SLOW_FACTOR * median

        def band(kind: str, o: NodeOutcome = o) -> str:
            values = [
                bus_bandwidth_gbs(timed_bytes, r.all_reduce_s if kind == "all_reduce" else r.all_to_all_s, world, kind)
                for r in o.ranks
            ]
            return f"{kind} {min(values):.2f}-{max(values):.2f} GB/s bus"

        lines.append(
            f"{name}: ranks {first}-{last}: {'SLOW' if slow else 'ok'}; "
            f"set-up {max(r.setup_s for r in o.ranks):.1f} s; {band('all_reduce')}, {band('all_to_all')}"
            + (f" ({times[i] / median:.1f}x the median node's time)" if slow else "")
        )
    shape = f"{world} ranks on {nnodes} nodes, {backend}, {timed_bytes / (1 << 20):g} MiB per rank"
    failed = [ln.split(":")[0] for ln in lines if ": FAIL" in ln]
    lines.append(f"{'PASS' if ok else 'FAIL'} ({shape})" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return ok, lines
