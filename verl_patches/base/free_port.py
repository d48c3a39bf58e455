"""TCP ports on this host: one asked of the kernel, a fixed one checked, a block of fixed ones chosen.

`free_port` binds on 127.0.0.1 only, never on all interfaces: asking for a port must not open one to the network,
even for the moment it takes. The port is free when this returns, not reserved: its user binds it next (a rank
0's store, a server), and a collision with another process in between shows as that bind's error.

`port_is_free` asks whether a server could bind a given port now, as the servers that take our ports bind
(torch's TCPStore and Ray set SO_REUSEADDR, so a connection of a finished run waiting out TIME_WAIT on that
port does not count as busy; a socket bound or listening there does).

`free_port_block` picks ports a job binds at a known offset from a base (vLLM's DP masters: base+1 onwards):
outside the kernel's ephemeral range, because every outgoing connection of the job (Ray, gloo, HCCL, store
clients) takes a random local port from that range, and a planned port inside it can be taken by one of them.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL = (32768, 60999)  # the kernel's default when the file cannot be read (not Linux)
LOWEST_PORT = 1024  # below: privileged
HIGHEST_PORT = 65535


class PortBlockError(RuntimeError):
    """No block of ports fits, or none is free; the message names the host, the count and the ranges tried."""


def free_port() -> int:
    """A port number the kernel just handed to a socket on 127.0.0.1, which is closed again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_is_free(host: str, port: int) -> bool:
    """Whether a server setting SO_REUSEADDR could bind ``host:port`` now (the socket is closed at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (``low``, ``high``, both included)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return LINUX_DEFAULT_EPHEMERAL
    parts = text.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) > int(parts[1]):
        raise PortBlockError(f"{path}: expected two port numbers 'low high', found {text.strip()!r}")
    return int(parts[0]), int(parts[1])


def block_starts(count: int, avoid: Sequence[tuple[int, int]]) -> list[range]:
    """Every first port ``s`` such that ``s .. s+count-1`` lies in 1024..65535 and misses each ``(low, high)``
    range of ``avoid`` (both ends included), as ranges in increasing order (pure)."""
    if count < 1:
        raise ValueError(f"a block of {count} ports")
    out: list[range] = []
    start = LOWEST_PORT  # the first port not yet known to be avoided
    for low, high in sorted(avoid) + [(HIGHEST_PORT + 1, HIGHEST_PORT + 1)]:
        gap = range(start, min(low, HIGHEST_PORT + 1) - count + 1)  # the block ends before `low`
        if len(gap) > 0:
            out.append(gap)
        start = max(start, high + 1)
    return out


def free_port_block(
    count: int,
    host: str = "127.0.0.1",
    avoid: Sequence[tuple[int, int]] = (),
    tries: int = 64,
    rng: random.Random | None = None,
    ephemeral: tuple[int, int] | None = None,
    is_free: Callable[[str, int], bool] = port_is_free,
) -> int:
    """The first of ``count`` consecutive ports, outside the ephemeral range and ``avoid`` (other ranges a
    program hands out by itself, as Ray its worker ports), that are free on ``host`` now.

    Free when this returns, not reserved (as `free_port`): their users bind them next, and check again."""
    eph = ephemeral_range() if ephemeral is None else ephemeral
    ranges = [eph, *avoid]
    starts = block_starts(count, ranges)
    shown = ", ".join(f"{low}..{high}" for low, high in sorted(ranges))
    if not starts:
        raise PortBlockError(
            f"no {count} consecutive ports in {LOWEST_PORT}..{HIGHEST_PORT} outside {shown} (the ephemeral range "
            f"from {EPHEMERAL_RANGE_FILE} and the ranges to avoid)"
        )
    pick = rng or random.Random()
    total = sum(len(r) for r in starts)
    for _ in range(tries):
        i = pick.randrange(total)
        for r in starts:
            if i < len(r):
                first = r[i]
                break
            i -= len(r)
        if all(is_free(host, p) for p in range(first, first + count)):
            return first
    raise PortBlockError(f"no {count} consecutive free ports on {host} outside {shown} after {tries} random tries")
