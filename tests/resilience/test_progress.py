"""Progress marks, positions, their order across ranks, the time-out setting and fault injection."""

from __future__ import annotations

import signal

import pytest

from verl_patches.resilience import fault_injection, progress
from verl_patches.resilience.progress import PHASE_ORDER, Position
from verl_patches.resilience.timeout import TIMEOUT_ENV, configured_timeout, publish_interval, stale_after


@pytest.fixture(autouse=True)
def fresh() -> None:
    progress.reset()
    yield
    progress.reset()


def test_a_call_its_phases_and_units() -> None:
    assert progress.current()[0] == Position(0, "", None, "idle")
    progress.enter_call("update_actor", 3, "update")
    progress.begin_group()
    progress.unit("micro-batch", 1, 4)
    progress.unit("micro-batch", 2, 4)
    pos, age = progress.current()
    assert pos == Position(4, "update_actor", 3, "update", "micro-batch", 2, 4, 1, False) and 0 <= age < 5
    assert pos.describe() == "phase 'update' (micro-batch 2/4 of batch 1) of step 3 in update_actor"
    progress.leave_call()
    assert progress.current()[0] == Position(5, "update_actor", 3, "idle")
    assert progress.current()[0].describe() == "phase 'idle' of step 3 after update_actor"
    progress.enter_call("save_checkpoint", None, "save_checkpoint")  # no step in the payload: keeps the last
    pos = progress.current()[0]
    assert pos.step == 3 and pos.coarse and pos.describe() == "phase 'save_checkpoint' of step 3 in save_checkpoint"


def test_a_phase_keeps_the_batch_count_and_clears_the_unit() -> None:
    progress.enter_call("generate_sequences", 1, "generate")
    progress.phase("weight_sync")
    progress.unit("bucket", 7)
    assert progress.current()[0].describe() == "phase 'weight_sync' (bucket 7) of step 1 in generate_sequences"
    progress.phase("generate")
    pos = progress.current()[0]
    assert (pos.unit, pos.index, pos.coarse) == ("", None, True)


def test_order_key_follows_step_then_phase_then_batch_then_unit() -> None:
    def at(step: int, phase: str, group: int = 0, index: int | None = None) -> Position:
        return Position(0, "c", step, phase, "u" if index else "", index, None, group)

    ordered = [
        at(4, "idle"),
        at(5, "weight_sync", 0, 9),
        at(5, "generate", 0, 2),
        at(5, "ref", 1, 1),
        at(5, "update", 1, 3),
        at(5, "update", 2, 1),
        at(5, "save_checkpoint"),
        at(6, "init"),
    ]
    assert sorted(ordered, key=Position.order_key) == ordered
    assert len(set(PHASE_ORDER)) == len(PHASE_ORDER)


def test_position_round_trips_through_a_heartbeat() -> None:
    p = Position(9, "update_actor", 2, "update", "micro-batch", 3, 8, 2, False)
    assert Position.from_dict(p.to_dict()) == p


def test_timeout_setting_is_validated_and_shapes_the_intervals() -> None:
    assert configured_timeout({}) == 0
    assert configured_timeout({TIMEOUT_ENV: " 30 "}) == 30
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ValueError, match=TIMEOUT_ENV):
            configured_timeout({TIMEOUT_ENV: bad})
    assert publish_interval(540) == 5 and publish_interval(1) == 0.2 and publish_interval(20) == 1
    assert stale_after(540) == 25 and stale_after(4) == 2
    for t in (1, 4, 30, 540, 3600):
        assert publish_interval(t) * 3 < stale_after(t)


def test_fault_injection_spec() -> None:
    assert fault_injection.parse("1:update:3") == fault_injection.FaultAt(1, "update", 3)
    for bad in ("1:update", "x:update:3", "1:updating:3"):
        with pytest.raises(ValueError, match=fault_injection.INJECT_ENV):
            fault_injection.parse(bad)


def test_fault_injection_stops_only_the_named_rank_entering_the_named_phase_and_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = []
    monkeypatch.setattr(fault_injection.os, "kill", lambda pid, sig: sent.append(sig))
    env = {fault_injection.INJECT_ENV: "2:weight_sync:4"}
    assert fault_injection.arm(1, env) == [] and progress._on_phase is None
    published = lambda: sent.append(("published", progress.current()[0].phase))  # noqa: E731
    assert fault_injection.arm(2, env, before_stop=published) == [fault_injection.FaultAt(2, "weight_sync", 4)]
    progress.enter_call("generate_sequences", 3, "generate")
    progress.phase("weight_sync")  # step 3: not yet
    progress.enter_call("generate_sequences", 4, "generate")
    progress.unit("bucket", 1)
    assert sent == []
    progress.phase("weight_sync")
    assert sent == [("published", "weight_sync"), signal.SIGSTOP]  # its position is out before it stops


def test_phase_of_a_worker_group_method() -> None:
    assert progress.phase_of_call("actor_rollout_ref_update_actor") == "update"
    assert progress.phase_of_call("generate_sequences") == "weight_sync"
    assert progress.phase_of_call("actor_rollout_ref_compute_ref_log_prob") == "ref"
    assert progress.phase_of_call("get_rank_memory") is None
