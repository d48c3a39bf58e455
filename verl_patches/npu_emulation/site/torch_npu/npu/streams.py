"""Streams and events: work on the CPU is synchronous, so every stream is the one default stream."""

import contextlib
import time

try:  # torch 2.5.1 (the A3 pin): torch._dynamo's device registry requires these bases; later torch dropped them
    from torch._streambase import _EventBase, _StreamBase
except ImportError:  # pragma: no cover - newer torch
    _EventBase = _StreamBase = object


class Stream(_StreamBase):
    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device, self.priority = device, priority

    def wait_stream(self, stream) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream)  # one synchronous stream: every stream is the same

    __hash__ = object.__hash__

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


class Event(_EventBase):
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._t = None

    def record(self, stream=None) -> None:
        self._t = time.perf_counter()

    def wait(self, stream=None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: "Event") -> float:
        return (end._t - self._t) * 1000.0


_DEFAULT = Stream()


def current_stream(device=None) -> Stream:
    return _DEFAULT


def default_stream(device=None) -> Stream:
    return _DEFAULT


@contextlib.contextmanager
def stream(s=None):
    yield s
