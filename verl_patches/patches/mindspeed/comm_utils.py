"""MindSpeed's MoE all-to-all helper with a waitable handle when the group has one rank.

`async_all_to_all` returns (input, input, None) for a single-rank expert-parallel group: the all-to-all
overlap backward (moe_layer_overlap_all2all.py) calls `.wait()` on the None handle, and the overlap
path later frees the "received" tensor's storage, which is the input itself. A completed handle and a
copy of the input keep every caller correct (those that test for None and those that wait).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class CompletedHandle:
    """A communication handle whose work is already done (nothing was sent)."""

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def waitable_single_rank_all_to_all(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def async_all_to_all(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if isinstance(out, tuple) and len(out) == 3 and out[2] is None:
            received = out[1].clone() if out[1] is out[0] else out[1]
            return out[0], received, CompletedHandle()
        return out

    return async_all_to_all
