"""The head names the nodes of NODES that have not joined (issue 42, item 4): the pure diff of NODES against Ray's
node table (`node_roster.observe`), every way a node can be named, what the head last saw of each node over time,
and the wait loop's lines and time-out error with Ray's table stood in for."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.launch.cluster import node_roster, ray_cluster
from verl_patches.launch.cluster.node_roster import (
    JOINED,
    LEFT,
    NEVER,
    PARTIAL,
    ExpectedNode,
    RayNodeRow,
    Sighting,
    expected_nodes,
    missing_text,
    observe,
    reason,
    rows_from_ray,
)
from verl_patches.launch.cluster.ray_cluster import RayClusterError, wait_for_resource

FIXED = lambda t: "T" if t is None else f"t{t:g}"  # noqa: E731  (a clock that needs no time zone)


def row(address: str, host: str = "", alive: bool = True, npus: float = 16, death: str = "") -> RayNodeRow:
    return RayNodeRow(address, host, alive, npus, death)


# ---- how an entry of NODES matches a row of Ray's node table ---------------------------------------------

# (entry as written in NODES, what it resolves to) -> must match a Ray node started on 10.0.0.7 on host a3-node-07
NAMINGS = {
    "the address Ray runs on": ("10.0.0.7", []),
    "the host name": ("a3-node-07", []),
    "the host name, other case": ("A3-Node-07", []),
    "a fully qualified name": ("a3-node-07.cluster.local", []),
    "a name that resolves to Ray's address": ("gpu7", ["10.0.0.7"]),
    "a management address whose reverse name is the host": ("192.168.1.7", ["a3-node-07.mgmt"]),
}


@pytest.mark.parametrize("how", sorted(NAMINGS))
def test_an_entry_matches_its_ray_node_however_it_is_named(how: str) -> None:
    entry, resolved = NAMINGS[how]
    node = ExpectedNode.of(entry, resolved)
    view = observe([node], [row("10.0.0.7", "a3-node-07")], 16, now=1.0)
    assert view.sightings[entry].state == JOINED and view.unexpected == ()


@pytest.mark.parametrize(
    "entry,resolved",
    [("10.0.0.70", []), ("a3-node-7", []), ("a3-node-070", ["10.0.0.70"]), ("192.168.1.7", ["a3-node-08"])],
)
def test_near_misses_do_not_match(entry: str, resolved: list[str]) -> None:
    view = observe([ExpectedNode.of(entry, resolved)], [row("10.0.0.7", "a3-node-07")], 16, now=1.0)
    assert view.sightings[entry].state == NEVER
    assert view.unexpected == ("10.0.0.7 (a3-node-07)",)  # the live node NODES does not name is listed


# ---- every state, exhaustively over small tables ---------------------------------------------------------

ROW_KINDS = {
    "alive full": row("10.0.0.1", "n1", True, 16),
    "alive partial": row("10.0.0.1", "n1", True, 8),
    "alive empty": row("10.0.0.1", "n1", True, 0),
    "dead": row("10.0.0.1", "n1", False, 0, "node stopped"),
}


@pytest.mark.parametrize(
    "kinds", [c for n in range(3) for c in itertools.combinations_with_replacement(sorted(ROW_KINDS), n)]
)
@pytest.mark.parametrize("before", [None, NEVER, PARTIAL, JOINED, LEFT])
def test_state_of_one_node_for_every_table(kinds: tuple[str, ...], before: str | None) -> None:
    node = ExpectedNode.of("n1")
    table = [ROW_KINDS[k] for k in kinds]
    prev = {} if before is None else {"n1": Sighting(before, 16 if before == JOINED else 0, 5.0)}
    s = observe([node], table, 16, now=9.0, before=prev).sightings["n1"]
    live = [r for r in table if r.alive]
    if live:
        npus = sum(r.npus for r in live)
        assert s.state == (JOINED if npus >= 16 else PARTIAL) and s.npus == npus
    elif any(not r.alive for r in table) or before in (JOINED, PARTIAL, LEFT):
        assert s.state == LEFT and s.npus == 0
        if any(not r.alive for r in table):
            assert s.death == "node stopped"
    else:
        assert s.state == NEVER
    assert s.since == (5.0 if before == s.state else 9.0)  # kept while the state holds, else now


def test_a_node_that_left_keeps_the_time_it_was_first_seen_gone() -> None:
    node = [ExpectedNode.of("n1")]
    v1 = observe(node, [row("10.0.0.1", "n1")], 16, now=100.0)
    assert v1.sightings["n1"].state == JOINED
    v2 = observe(node, [row("10.0.0.1", "n1", alive=False, npus=0)], 16, now=130.0, before=v1.sightings)
    v3 = observe(node, [row("10.0.0.1", "n1", alive=False, npus=0)], 16, now=160.0, before=v2.sightings)
    assert v3.sightings["n1"] == Sighting(LEFT, 0.0, 130.0, "")
    assert reason(v3.sightings["n1"], 16, FIXED) == "left at t130"
    # it came back (a retrying worker): a new live row beside the dead one
    v4 = observe(node, [row("10.0.0.1", "n1", False, 0), row("10.0.0.1", "n1")], 16, now=190.0, before=v3.sightings)
    assert v4.sightings["n1"].state == JOINED and v4.missing() == []


def test_a_node_gone_from_the_table_after_it_was_seen_has_left() -> None:
    node = [ExpectedNode.of("n1")]
    v1 = observe(node, [row("10.0.0.1", "n1", npus=8)], 16, now=1.0)
    v2 = observe(node, [], 16, now=2.0, before=v1.sightings)
    assert v2.sightings["n1"].state == LEFT and v2.sightings["n1"].since == 2.0


@st.composite
def tables(draw):
    hosts = [f"n{i}" for i in range(6)]
    rows = draw(
        st.lists(
            st.builds(
                lambda i, alive, npus: row(f"10.0.0.{i}", f"n{i}", alive, npus if alive else 0),
                st.integers(0, 7),
                st.booleans(),
                st.sampled_from([0, 4, 8, 16]),
            ),
            max_size=10,
        )
    )
    entries = draw(st.lists(st.sampled_from(hosts + [f"10.0.0.{i}" for i in range(6)]), unique=True, max_size=6))
    return entries, rows


@settings(max_examples=300, deadline=None)
@given(tables(), st.sampled_from([4.0, 16.0]))
def test_observe_invariants(case, per_node: float) -> None:
    entries, rows = case
    view = observe([ExpectedNode.of(e) for e in entries], rows, per_node, now=1.0)
    assert list(view.sightings) == entries  # NODES order, one sighting each
    for e in entries:
        suffix = e.rsplit(".", 1)[-1] if e[0].isdigit() else e[1:]
        mine = [r for r in rows if r.hostname == f"n{suffix}"]
        live = sum(r.npus for r in mine if r.alive)
        state = view.sightings[e].state
        assert (state == JOINED) == (any(r.alive for r in mine) and live >= per_node)
        assert (state == NEVER) == (not mine)
        assert (state == LEFT) == (bool(mine) and not any(r.alive for r in mine))
    named = {h for e in entries for h in ({e} if not e[0].isdigit() else {f"n{e.rsplit('.', 1)[-1]}"})}
    assert sorted(view.unexpected) == sorted(r.label() for r in rows if r.alive and r.hostname not in named)
    assert view.missing() == [e for e in entries if view.sightings[e].state != JOINED]


# ---- the text: compact in the progress line, complete in the error ---------------------------------------


def test_missing_text_is_compact_with_a_limit_and_complete_without() -> None:
    entries = [f"a3-node-{i:02d}" for i in range(1, 17)]
    table = [row(f"10.0.0.{i}", f"a3-node-{i:02d}") for i in range(1, 7)]
    table += [row("10.0.0.7", "a3-node-07", npus=8), row("10.0.0.8", "a3-node-08", alive=False, npus=0, death="OOM")]
    table += [row("10.9.9.9", "stranger")]
    prev = {"a3-node-08": Sighting(JOINED, 16, 50.0)}
    view = observe([ExpectedNode.of(e) for e in entries], table, 16, now=60.0, before=prev)
    short = missing_text(view, 16, limit=3, clock=FIXED)
    assert short == (
        "missing 10: a3-node-07 joined with 8 of 16 NPUs, a3-node-08 left at t60 (OOM), a3-node-09 never seen, "
        "+7 more; joined but not in NODES: 10.9.9.9 (stranger)"
    )
    full = missing_text(view, 16, clock=FIXED)
    assert all(f"a3-node-{i:02d} never seen" in full for i in range(9, 17)) and "more" not in full
    assert missing_text(observe([ExpectedNode.of("n1")], [row("1.1.1.1", "n1")], 16, 1.0), 16) == ""


def test_rows_from_ray_reads_the_fields_it_needs_and_tolerates_missing_ones() -> None:
    table = [
        {
            "NodeManagerAddress": "10.0.0.1",
            "NodeManagerHostname": "n1",
            "Alive": True,
            "Resources": {"NPU": 16.0, "CPU": 8},
        },
        {"NodeManagerAddress": "10.0.0.2", "Alive": False, "Resources": {}, "DeathReasonMessage": " gone "},
        {"Alive": True},
        {"NodeManagerAddress": "10.0.0.3", "Alive": True, "Resources": {"NPU": "junk"}},
    ]
    assert rows_from_ray(table, "NPU") == [
        RayNodeRow("10.0.0.1", "n1", True, 16.0),
        RayNodeRow("10.0.0.2", "", False, 0.0, "gone"),
        RayNodeRow("", "", True, 0.0),
        RayNodeRow("10.0.0.3", "", True, 0.0),
    ]


# ---- looking names up -------------------------------------------------------------------------------------


def test_expected_nodes_looks_each_entry_up_and_keeps_a_silent_one_as_written() -> None:
    release = threading.Event()

    def lookup(entry: str) -> list[str]:
        if entry == "silent":
            release.wait(30)
            return ["10.0.0.99"]
        return {"a3-node-01": ["10.0.0.1"], "10.0.0.2": ["a3-node-02.cluster"]}.get(entry, [])

    t0 = time.monotonic()
    try:
        nodes = expected_nodes(["a3-node-01", "10.0.0.2", "silent"], lookup=lookup, timeout_s=0.5)
    finally:
        release.set()
    assert time.monotonic() - t0 < 5
    assert [n.entry for n in nodes] == ["a3-node-01", "10.0.0.2", "silent"]
    assert nodes[0].names == {"a3-node-01", "10.0.0.1"}
    assert nodes[1].names == {"10.0.0.2", "a3-node-02.cluster", "a3-node-02"}
    assert nodes[2].names == {"silent"}


def test_the_default_lookup_uses_the_resolver_both_ways() -> None:
    assert "127.0.0.1" in node_roster._lookup("localhost")
    assert node_roster._lookup("127.0.0.1")  # the hosts file names loopback
    assert node_roster._lookup("no-such-host.invalid") == []


# ---- the wait loop, with Ray's table stood in for ---------------------------------------------------------


@pytest.fixture
def fake_table(monkeypatch: pytest.MonkeyPatch):
    """ray_cluster.node_rows answers from a list of tables, one per poll (the last repeats)."""
    tables: list[list[RayNodeRow]] = []

    def node_rows(_address: str, _resource: str) -> list[RayNodeRow]:
        return tables.pop(0) if len(tables) > 1 else tables[0]

    monkeypatch.setattr(ray_cluster, "node_rows", node_rows)
    monkeypatch.setattr(ray_cluster, "_port_open", lambda _a, timeout_s=1.0: True)
    return tables


def test_the_wait_names_the_missing_nodes_each_line_and_all_of_them_at_the_time_out(fake_table) -> None:
    nodes = [ExpectedNode.of(f"a3-node-{i:02d}") for i in range(1, 17)]
    full = [row(f"10.0.0.{i}", f"a3-node-{i:02d}") for i in range(1, 7)]
    fake_table += [full, full + [row("10.0.0.7", "a3-node-07", npus=8)]]
    lines: list[str] = []
    with pytest.raises(RayClusterError) as e:
        wait_for_resource(
            "127.0.0.1:1", "NPU", 256, 16, timeout_s=0.3, progress=lines.append, poll_s=0.1, nodes=nodes, per_node=16
        )
    assert lines[0].startswith("waiting for NPUs: 96/256 on 6/16 nodes (")
    assert lines[0].endswith(
        "; missing 10: a3-node-07 never seen, a3-node-08 never seen, a3-node-09 never seen, "
        "a3-node-10 never seen, a3-node-11 never seen, a3-node-12 never seen, +4 more"
    )
    assert "a3-node-07 joined with 8 of 16 NPUs" in lines[1] and "104/256 on 7/16" in lines[1]
    assert len(lines) == 2  # a line per change, not per poll
    msg = str(e.value)
    assert msg.startswith("only 104 of 256 NPUs joined within 0 s (7/16 nodes): missing 10: a3-node-07 joined with 8")
    assert all(f"a3-node-{i:02d} never seen" in msg for i in range(8, 17)) and "WAIT_TIMEOUT_S" in msg


def test_the_wait_repeats_an_unchanged_line_every_report_interval(fake_table) -> None:
    fake_table.append([row("10.0.0.1", "n1")])
    lines: list[str] = []
    with pytest.raises(RayClusterError):
        wait_for_resource(
            "127.0.0.1:1",
            "NPU",
            32,
            2,
            timeout_s=0.5,
            progress=lines.append,
            poll_s=0.1,
            nodes=[ExpectedNode.of("n1"), ExpectedNode.of("n2")],
            report_s=0.2,
        )
    assert 2 <= len(lines) <= 4 and len({ln.split(" (")[0] for ln in lines}) == 1
    assert lines[0].endswith("; missing 1: n2 never seen")


def test_the_wait_returns_once_all_joined_and_without_nodes_names_the_joined(fake_table) -> None:
    fake_table.append([row("10.0.0.1", "n1"), row("10.0.0.2", "n2")])
    lines: list[str] = []
    wait_for_resource(
        "127.0.0.1:1",
        "NPU",
        32,
        2,
        timeout_s=5,
        progress=lines.append,
        poll_s=0.1,
        nodes=[ExpectedNode.of("n1"), ExpectedNode.of("10.0.0.2")],
    )
    assert (
        lines == [lines[0]]
        and lines[0].startswith("waiting for NPUs: 32/32 on 2/2 nodes")
        and "missing" not in lines[0]
    )
    fake_table[:] = [[row("10.0.0.1", "n1")]]
    with pytest.raises(RayClusterError) as e:
        wait_for_resource("127.0.0.1:1", "NPU", 32, 2, timeout_s=0.2, progress=lambda _l: None, poll_s=0.1)
    assert "joined: 10.0.0.1 (n1) (set NODES in the env file to have the missing nodes named)" in str(e.value)
