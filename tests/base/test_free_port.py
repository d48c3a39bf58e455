"""Ports: a fixed port is free as a SO_REUSEADDR server sees it (TIME_WAIT is free, a bound or listening socket
is not); a block of fixed ports misses the kernel's ephemeral range for every range and size, and is free on
the host when handed out."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.base.free_port import (
    HIGHEST_PORT,
    LOWEST_PORT,
    PortBlockError,
    block_starts,
    ephemeral_range,
    free_port,
    free_port_block,
    port_is_free,
)


def test_a_listening_or_bound_port_is_busy_and_free_once_closed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
        port = s.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)  # bound, not listening yet
        s.listen()
        assert not port_is_free("127.0.0.1", port)
    assert port_is_free("127.0.0.1", port)


def test_a_port_left_in_time_wait_is_free_as_the_stores_bind_it() -> None:
    """A finished store's connection on the port waits out TIME_WAIT; torch's TCPStore binds with SO_REUSEADDR
    (and its connections inherit it), so a new store starts anyway and the check must not call the port busy (a
    plain bind does: the case is really exercised)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store does
    server.bind(("127.0.0.1", free_port()))
    port = server.getsockname()[1]
    server.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT on `port`
    client.recv(1)
    client.close()
    server.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    assert port_is_free("127.0.0.1", port)


def test_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    f = tmp_path / "ip_local_port_range"
    f.write_text("10000\t20000\n")
    assert ephemeral_range(f) == (10000, 20000)
    assert ephemeral_range(tmp_path / "absent") == (32768, 60999)
    for bad in ("", "10000", "a b", "20000 10000", "1 2 3"):
        f.write_text(bad)
        with pytest.raises(PortBlockError, match=str(f)):
            ephemeral_range(f)
    low, high = ephemeral_range()  # this host's
    assert 0 < low <= high <= HIGHEST_PORT


port_ranges = st.tuples(st.integers(1, HIGHEST_PORT), st.integers(0, HIGHEST_PORT)).map(
    lambda t: (t[0], min(HIGHEST_PORT, t[0] + t[1]))
)


@settings(max_examples=300, deadline=None)
@given(avoid=st.lists(port_ranges, max_size=4), count=st.integers(1, 70000))
def test_every_block_start_misses_the_avoided_ranges_and_none_is_left_out(
    avoid: list[tuple[int, int]], count: int
) -> None:
    starts = block_starts(count, avoid)
    got = {s for r in starts for s in r}
    assert all(a.stop <= b.start for a, b in zip(starts, starts[1:]))  # increasing, disjoint

    def fits(s: int) -> bool:  # the oracle: the block lies in 1024..65535 and misses every avoided range
        end = s + count - 1
        return LOWEST_PORT <= s and end <= HIGHEST_PORT and all(end < low or s > high for low, high in avoid)

    edges = [LOWEST_PORT, HIGHEST_PORT - count + 1, HIGHEST_PORT - count + 2]
    for low, high in avoid:
        edges += [low - count, low - count + 1, high, high + 1]
    rng = random.Random(count + sum(low for low, _ in avoid))
    for s in rng.sample(range(LOWEST_PORT, HIGHEST_PORT + 1), 200) + edges:
        assert (s in got) == fits(s), s


def test_block_of_zero_ports_is_refused() -> None:
    with pytest.raises(ValueError):
        block_starts(0, [(32768, 60999)])


def test_a_free_block_is_outside_the_ephemeral_and_avoided_ranges_and_bindable() -> None:
    low, high = ephemeral_range()
    for _ in range(5):
        first = free_port_block(4, avoid=[(10001, 19999)])
        block = range(first, first + 4)
        assert all((p < low or p > high) and not 10001 <= p <= 19999 for p in block)
        assert all(port_is_free("127.0.0.1", p) for p in block)


def test_a_busy_port_inside_a_candidate_block_makes_it_try_another() -> None:
    busy = {2000, 2001}
    seen: list[int] = []

    def is_free(host: str, port: int) -> bool:
        seen.append(port)
        return port not in busy

    class Picks(random.Random):
        order = iter([1999 - LOWEST_PORT, 2002 - LOWEST_PORT])

        def randrange(self, n: int) -> int:  # type: ignore[override]
            return next(self.order)

    assert free_port_block(3, rng=Picks(), ephemeral=(32768, 60999), is_free=is_free) == 2002
    assert 2000 in seen


def test_no_room_and_no_free_block_are_clear_errors() -> None:
    with pytest.raises(PortBlockError, match=r"no 10 consecutive ports in 1024\.\.65535 outside 1000\.\.40000, 40005"):
        free_port_block(10, avoid=[(40005, 65535)], ephemeral=(1000, 40000))
    with pytest.raises(
        PortBlockError, match=r"no 2 consecutive free ports on 127\.0\.0\.1 outside .* after 5 random tries"
    ):
        free_port_block(2, tries=5, ephemeral=(32768, 60999), is_free=lambda h, p: False)
