"""The heartbeat: published by a side thread while the main thread is blocked, with the position, the
identity of the process, activity in coarse phases and where a still main thread is."""

from __future__ import annotations

import json
import threading
import time

import pytest

from verl_patches.resilience import progress
from verl_patches.resilience.boards import DictBoard
from verl_patches.resilience.heartbeat import Heartbeat, process_identity


@pytest.fixture(autouse=True)
def fresh() -> None:
    progress.reset()
    yield
    progress.reset()


def published(board: DictBoard, key: str = "me") -> dict:
    return json.loads(board.values[key])


def test_beats_go_on_while_the_main_thread_is_blocked() -> None:
    board = DictBoard()
    hb = Heartbeat(board, "me", {"rank": 3}, interval_s=0.05).start()
    try:
        progress.enter_call("update_actor", 2, "update")
        progress.unit("micro-batch", 1, 2)
        time.sleep(1.0)  # this thread (the "main" one here) blocks; the side thread keeps publishing
        first = published(board)
        time.sleep(0.5)
        second = published(board)
    finally:
        hb.stop()
    assert second["beat"] > first["beat"] >= 5
    assert second["rank"] == 3 and second["pos"]["phase"] == "update" and second["pos"]["index"] == 1
    assert second["pos"]["marks"] == first["pos"]["marks"]  # no progress: the same marks, a moving beat
    assert (
        "test_heartbeat.py" in second["where"]
        and "test_beats_go_on_while_the_main_thread_is_blocked" in second["where"]
    )


def _spin(stop: threading.Event, park: threading.Event) -> None:
    def a() -> None:
        time.sleep(0.003)

    def b() -> None:
        time.sleep(0.003)

    while not stop.is_set():
        a()
        b()
    park.wait()


def test_activity_counts_stack_changes_only_in_a_coarse_phase() -> None:
    stop, park = threading.Event(), threading.Event()
    t = threading.Thread(target=_spin, args=(stop, park), daemon=True)
    t.start()
    board = DictBoard()
    hb = Heartbeat(board, "me", {"rank": 0}, interval_s=1.0, main_ident=t.ident)
    try:
        progress.enter_call("update_actor", 1, "update")  # not coarse: a moving stack is no progress
        for _ in range(20):
            hb.beat()
            time.sleep(0.01)
        assert hb.activity == 0
        progress.enter_call("generate_sequences", 1, "generate")  # coarse
        for _ in range(40):
            hb.beat()
            time.sleep(0.011)
        assert hb.activity >= 5  # the spinning thread was seen in a() and in b()
        stop.set()
        time.sleep(0.1)
        before = hb.activity
        for _ in range(10):
            hb.beat()
        assert hb.activity <= before + 1  # parked: one last change at most, then none
        assert "_spin" in published(board)["where"]
    finally:
        stop.set()
        park.set()


def test_identity_names_rank_host_pid_and_the_flight_recorder_when_torch_npu_has_it_on() -> None:
    ident = process_identity(5, {"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "29500"})
    assert ident["rank"] == 5 and ident["pid"] > 0 and ident["host"] and ident["store"] == "10.1.1.1:29500"
    assert "flight_recorder" not in ident
    on = {"TORCH_HCCL_DUMP_ON_TIMEOUT": "1", "TORCH_HCCL_ENABLE_MONITORING": "1"}
    assert process_identity(5, on)["flight_recorder"] == "/tmp/hccl_trace_rank_5"
    assert process_identity(5, {**on, "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": "/d/fr_"})["flight_recorder"] == "/d/fr_5"


def test_a_board_error_does_not_end_the_heartbeat() -> None:
    class Flaky(DictBoard):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def publish(self, key: str, value: str) -> None:
            self.calls += 1
            if self.calls in (2, 3):
                raise ConnectionError("store host gone")
            super().publish(key, value)

    board = Flaky()
    hb = Heartbeat(board, "me", {"rank": 0}, interval_s=0.02).start()
    time.sleep(0.5)
    hb.stop()
    assert hb.errors == 2 and published(board)["beat"] > 3
