"""A checkpoint written in the background (issue 42): the writer thread, its fence, and the worker's update that
waits for it.

The write is made slow on purpose; the order of what happens is recorded and read back: the update never starts
before the write ended, whoever calls it; a failed write is raised by the fence that waits for it, naming the step
and the rank, once; a new save waits for the previous write before it starts its own.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from verl_patches.checkpoint import background_write
from verl_patches.checkpoint.background_write import BackgroundWrite, BackgroundWriteError
from verl_patches.driver import checkpoint_fence
from verl_patches.patches.verl.utils.checkpoint import background_save


@pytest.fixture(autouse=True)
def _no_pending_write():
    background_write.fence_pending()
    yield
    try:
        background_write.fence_pending()
    except BackgroundWriteError:
        pass


def slow_write(events: list[str], files: list[Path], pause_s: float):
    def write(report):
        events.append("write started")
        for path in files:
            report(path, False)
            with open(path, "wb") as f:
                for _ in range(4):
                    f.write(b"x" * 1000)
                    f.flush()
                    time.sleep(pause_s / 4)
            report(path, True)
        events.append("write ended")
        return "record"

    return write


class FakeWorker:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def update_actor(self, data):
        self.events.append("update started")
        return data


def test_the_update_waits_for_the_write_that_reads_its_state(tmp_path: Path) -> None:
    events: list[str] = []
    files = [tmp_path / "model.pt", tmp_path / "optim.pt"]
    background_write.start(BackgroundWrite(6, 1, slow_write(events, files, 0.4)))
    events.append("save returned")  # the save call is back at once: the files are still being written
    update = background_save.fence_before_update(FakeWorker.update_actor)
    worker = FakeWorker(events)
    assert update(worker, "batch") == "batch"
    assert events.index("save returned") < events.index("write ended")
    assert events[-2:] == ["write ended", "update started"], events
    assert background_write.pending() is None
    assert [p.stat().st_size for p in files] == [4000, 4000]


def test_work_that_changes_nothing_overlaps_the_write(tmp_path: Path) -> None:
    events: list[str] = []
    write = BackgroundWrite(2, 0, slow_write(events, [tmp_path / "a.pt"], 0.6))
    t0 = time.monotonic()
    background_write.start(write)
    time.sleep(0.5)  # the next step's rollout and reference
    events.append("work done")
    result = background_write.fence_pending()
    took = time.monotonic() - t0
    assert events == ["write started", "work done", "write ended"]
    assert result is not None and result.result == "record" and result.files == 1 and result.nbytes == 4000
    assert result.waited_s < result.write_s and took < 1.0  # the work was not added to the write's time


def test_the_fence_marks_progress_while_the_storage_is_busy(tmp_path: Path) -> None:
    seen: list[int] = []
    write = BackgroundWrite(2, 0, slow_write([], [tmp_path / "a.pt"], 0.8)).start()
    write.fence(poll_s=0.05, on_wait=seen.append)
    assert seen and seen == sorted(seen) and max(seen) <= 4000  # bytes on disk so far, growing


def test_a_failed_write_is_raised_at_the_fence_naming_step_and_rank_once(tmp_path: Path) -> None:
    def failing(report):
        report(tmp_path / "model.pt", False)
        raise OSError(28, "No space left on device")

    background_write.start(BackgroundWrite(8, 3, failing))
    with pytest.raises(BackgroundWriteError) as err:
        background_write.fence_pending()
    msg = str(err.value)
    assert msg.startswith("checkpoint step 8: rank 3's background write failed: OSError")
    assert "No space left on device" in msg and "the step is not committed" in msg and "\n" not in msg
    assert background_write.fence_pending() is None  # reported once; nothing is pending any more


def test_an_update_after_a_failed_write_fails_before_it_changes_anything(tmp_path: Path) -> None:
    events: list[str] = []

    def failing(report):
        time.sleep(0.2)
        raise RuntimeError("storage gone")

    background_write.start(BackgroundWrite(4, 0, failing))
    update = background_save.fence_before_update(FakeWorker.update_actor)
    with pytest.raises(BackgroundWriteError, match="checkpoint step 4: rank 0's background write failed"):
        update(FakeWorker(events), "batch")
    assert events == []


def test_a_new_save_waits_for_the_previous_write_first(tmp_path: Path) -> None:
    events: list[str] = []
    first = BackgroundWrite(2, 0, slow_write(events, [tmp_path / "a.pt"], 0.4))
    background_write.start(first)
    second = BackgroundWrite(4, 0, slow_write(events, [tmp_path / "b.pt"], 0.0))
    background_write.start(second)  # fences `first` before it starts
    assert first.done and events[:2] == ["write started", "write ended"]
    background_write.fence_pending()
    assert events == ["write started", "write ended"] * 2


def test_the_worker_fence_without_a_pending_write_returns_at_once() -> None:
    t0 = time.monotonic()
    assert checkpoint_fence.fence_in_worker() is None
    assert time.monotonic() - t0 < 0.1


def test_the_worker_fence_reports_what_the_driver_needs(tmp_path: Path) -> None:
    background_write.start(BackgroundWrite(6, 2, slow_write([], [tmp_path / "a.pt"], 0.2)))
    found = checkpoint_fence.fence_in_worker()
    assert found is not None and set(found) == {"step", "rank", "write_s", "waited_s", "files", "nbytes"}
    assert (found["step"], found["rank"], found["files"], found["nbytes"]) == (6, 2, 1, 4000)


def test_a_write_thread_never_keeps_a_failing_process_alive() -> None:
    write = BackgroundWrite(2, 0, lambda report: time.sleep(0.1))
    assert write._thread.daemon
    write.start().fence()
    assert not any(t.name.startswith("checkpoint-write") for t in threading.enumerate() if t.is_alive())
