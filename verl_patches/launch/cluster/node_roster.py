"""Which nodes of NODES have not joined the Ray cluster yet, and what the head last saw of each.

NODES names every node by address or host name. Ray's node table knows a node by the address it was started
with (``--node-ip-address``: its SOCKET_IFNAME address) and by the host name it runs on. An entry matches a
Ray node when any of its names does: the entry as written, the IPv4 addresses a host name resolves to, the host
names an address resolves to, each host name also in its short form (``a3-node-01`` for
``a3-node-01.cluster``). So ``NODES=a3-node-01,...`` and ``NODES=10.0.0.1,...`` both work, and so does a
management address in NODES whose reverse name is the node's host name while Ray runs on the HCCL NIC.

`observe` is the pure part: the entries, the node table and what was seen before -> one `Sighting` per entry
(joined, joined with too few NPUs, left, never seen) and the live Ray nodes that match no entry. The names
are looked up once (`expected_nodes`), through the resolver this host already uses for MASTER_ADDR (hosts
file, DNS): nothing is sent to the nodes themselves, and a lookup that does not answer within a few seconds
leaves the entry with the name as written.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

JOINED, PARTIAL, LEFT, NEVER = "joined", "partial", "left", "never"
LOOKUP_TIMEOUT_S = 5.0  # for all of NODES together: the first progress line must not wait on a silent resolver


def _names_of(host: str) -> set[str]:
    """A host name in the forms it may be written: lower case, and its first label alone."""
    name = host.strip().rstrip(".").lower()
    if not name:
        return set()
    try:
        ipaddress.ip_address(name)
        return {name}
    except ValueError:
        return {name, name.split(".", 1)[0]}


@dataclass(frozen=True)
class ExpectedNode:
    """One entry of NODES and every name it is known by (the entry itself first)."""

    entry: str
    names: frozenset[str]

    @classmethod
    def of(cls, entry: str, resolved: Iterable[str] = ()) -> ExpectedNode:
        names = _names_of(entry)
        for other in resolved:
            names |= _names_of(other)
        return cls(entry, frozenset(names))


@dataclass(frozen=True)
class RayNodeRow:
    """One row of Ray's node table, as far as it says which machine it is and what it offers."""

    address: str
    hostname: str
    alive: bool
    npus: float
    death: str = ""  # Ray's reason for a dead node, when it gives one

    def names(self) -> set[str]:
        return _names_of(self.address) | _names_of(self.hostname)

    def label(self) -> str:
        return f"{self.address} ({self.hostname})" if self.hostname and self.hostname != self.address else self.address


def rows_from_ray(table: Iterable[Mapping[str, Any]], resource: str) -> list[RayNodeRow]:
    """``ray.nodes()`` as `RayNodeRow` s: NodeManagerAddress, NodeManagerHostname, Alive, Resources[resource]
    and DeathReasonMessage; a missing field reads as empty (a dead node's resources are often gone)."""
    rows = []
    for n in table:
        resources = n.get("Resources") or {}
        try:
            npus = float(resources.get(resource, 0.0) or 0.0)
        except (TypeError, ValueError):
            npus = 0.0
        rows.append(
            RayNodeRow(
                address=str(n.get("NodeManagerAddress") or ""),
                hostname=str(n.get("NodeManagerHostname") or ""),
                alive=bool(n.get("Alive")),
                npus=npus,
                death=str(n.get("DeathReasonMessage") or "").strip(),
            )
        )
    return rows


@dataclass(frozen=True)
class Sighting:
    """What the head last saw of one entry: its state, the NPUs its live Ray node(s) offer, and since when
    (``time.time()``) it has been in that state; for `LEFT`, when the head first saw it gone."""

    state: str
    npus: float = 0.0
    since: float | None = None
    death: str = ""


@dataclass(frozen=True)
class RosterView:
    sightings: dict[str, Sighting]  # entry -> sighting, in NODES order
    unexpected: tuple[str, ...]  # live Ray nodes that match no entry, as "address (host)"

    def missing(self) -> list[str]:
        """The entries that have not (fully) joined, in NODES order."""
        return [e for e, s in self.sightings.items() if s.state != JOINED]


def observe(
    expected: Sequence[ExpectedNode],
    table: Sequence[RayNodeRow],
    npus_per_node: float,
    now: float,
    before: Mapping[str, Sighting] | None = None,
) -> RosterView:
    """Each entry's state in ``table`` (pure).

    An entry is `JOINED` when its live Ray node(s) offer at least ``npus_per_node`` NPUs, `PARTIAL` when they
    offer fewer, `LEFT` when it has only dead rows (or was seen before and has no row now), `NEVER` otherwise.
    ``since`` carries over from ``before`` while the state stays the same, so a node that left keeps the time
    it was first seen gone. Live rows that match no entry are listed in ``unexpected``."""
    before = before or {}
    matched: set[int] = set()
    out: dict[str, Sighting] = {}
    for node in expected:
        mine = [i for i, row in enumerate(table) if row.names() & node.names]
        live = [table[i] for i in mine if table[i].alive]
        dead = [table[i] for i in mine if not table[i].alive]
        matched.update(i for i in mine if table[i].alive)
        prev = before.get(node.entry)
        if live:
            npus = sum(r.npus for r in live)
            state = JOINED if npus >= npus_per_node else PARTIAL
            death = ""
        elif dead or (prev is not None and prev.state in (JOINED, PARTIAL, LEFT)):
            state, npus = LEFT, 0.0
            death = next((r.death for r in reversed(dead) if r.death), prev.death if prev else "")
        else:
            state, npus, death = NEVER, 0.0, ""
        since = prev.since if prev is not None and prev.state == state else now
        out[node.entry] = Sighting(state, npus, since, death)
    unexpected = tuple(row.label() for i, row in enumerate(table) if row.alive and i not in matched)
    return RosterView(out, unexpected)


def _clock(t: float | None) -> str:
    return "?" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def reason(s: Sighting, npus_per_node: float, clock: Callable[[float | None], str] = _clock) -> str:
    """What the head last saw of an entry that has not joined, in a few words."""
    if s.state == PARTIAL:
        return f"joined with {s.npus:g} of {npus_per_node:g} NPUs"
    if s.state == LEFT:
        return f"left at {clock(s.since)}" + (f" ({s.death})" if s.death else "")
    if s.state == NEVER:
        return "never seen"
    return "joined"


def missing_text(
    view: RosterView,
    npus_per_node: float,
    limit: int | None = None,
    clock: Callable[[float | None], str] = _clock,
) -> str:
    """``"a3-node-07 never seen, a3-node-08 joined with 8 of 16 NPUs, ... +3 more"`` (all with ``limit`` None),
    followed by the live Ray nodes NODES does not name; '' when every entry joined and none is unexpected."""
    missing = view.missing()
    shown = missing if limit is None else missing[:limit]
    parts = [f"{e} {reason(view.sightings[e], npus_per_node, clock)}" for e in shown]
    if len(shown) < len(missing):
        parts.append(f"+{len(missing) - len(shown)} more")
    text = f"missing {len(missing)}: " + ", ".join(parts) if missing else ""
    if view.unexpected:
        extra = ", ".join(view.unexpected if limit is None else view.unexpected[:limit])
        more = "" if limit is None or len(view.unexpected) <= limit else f" +{len(view.unexpected) - limit} more"
        text += ("; " if text else "") + f"joined but not in NODES: {extra}{more}"
    return text


# ---- looking the names up (the one part that is not pure) ------------------------------------------------


def _lookup(entry: str) -> list[str]:
    """The other names of ``entry``: a host name's IPv4 addresses, an address's host names."""
    try:
        ipaddress.ip_address(entry)
        is_address = True
    except ValueError:
        is_address = False
    try:
        if is_address:
            host, aliases, _ = socket.gethostbyaddr(entry)
            return [host, *aliases]
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(entry, None, socket.AF_INET)})
    except (OSError, UnicodeError):
        return []


def expected_nodes(
    entries: Sequence[str],
    lookup: Callable[[str], list[str]] | None = None,
    timeout_s: float = LOOKUP_TIMEOUT_S,
) -> list[ExpectedNode]:
    """NODES' entries with the names they resolve to (``lookup``, default: this host's resolver), looked up in
    parallel; an entry whose lookup does not answer within ``timeout_s`` (all together) keeps the name as written."""
    if not entries:
        return []
    lookup = lookup or _lookup
    pool = ThreadPoolExecutor(max_workers=min(32, len(entries)), thread_name_prefix="node-lookup")
    try:
        futures = [pool.submit(lookup, e) for e in entries]
        wait(futures, timeout=timeout_s)
        return [
            ExpectedNode.of(e, f.result() if f.done() and f.exception() is None else ())
            for e, f in zip(entries, futures)
        ]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "ExpectedNode",
    "JOINED",
    "LEFT",
    "NEVER",
    "PARTIAL",
    "RayNodeRow",
    "RosterView",
    "Sighting",
    "expected_nodes",
    "missing_text",
    "observe",
    "reason",
    "rows_from_ray",
]
