"""verl.protocol.union_tensor_dict that accepts a locked TensorDict on the left (vendor item C7).

With D2D the workers union a tensor-less DataProto from the driver with tensors from their cache; the
empty TensorDict arrives locked (tensordict locks the results of chunk/split), and upstream's union
then fails on the first insert. We unlock for the inserts and lock again, so the caller's lock state is
kept; a key present on both sides must still hold equal tensors.
"""

from __future__ import annotations

import functools
import io
from typing import Any


def union_tensor_dict(tensor_dict1: Any, tensor_dict2: Any) -> Any:
    """Add tensor_dict2's keys to tensor_dict1 (in place) and return it."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise AssertionError(
            f"Two tensor dict must have identical batch size. Got {tensor_dict1.batch_size} "
            f"and {tensor_dict2.batch_size}"
        )
    was_locked = bool(getattr(tensor_dict1, "is_locked", False))
    new_keys = [k for k in tensor_dict2.keys() if k not in tensor_dict1.keys()]
    for key in tensor_dict2.keys():
        if key not in new_keys and not tensor_dict1[key].equal(tensor_dict2[key]):
            raise AssertionError(f"{key} in tensor_dict1 and tensor_dict2 are not the same object")
    if not new_keys:
        return tensor_dict1
    if was_locked:
        tensor_dict1.unlock_()
    try:
        for key in new_keys:
            tensor_dict1[key] = tensor_dict2[key]
    finally:
        if was_locked:
            tensor_dict1.lock_()
    return tensor_dict1


def pickle_empty_batch(getstate: Any) -> Any:
    """WRAP of ``DataProto.__getstate__``: a batch with a size but no tensor pickles too.

    With D2D the driver sends compute_ref_log_prob a batch that only says how many rows it has, and the
    workers answer with one (vendor item A2); upstream's ``__getstate__`` consolidates the TensorDict first
    (tensordict >= 0.5), which fails on one without tensors (``torch.cat`` of an empty list), so Ray could
    not ship either. There is nothing to consolidate then: save it as it is. Every other batch takes
    upstream's path.
    """

    @functools.wraps(getstate)
    def __getstate__(self: Any) -> Any:
        batch = self.batch
        if batch is None or len(batch.keys()) > 0:
            return getstate(self)

        # lazy: torch is heavy and only this path needs it; importing this module stays light
        import torch

        buffer = io.BytesIO()
        torch.save(batch, buffer)
        return buffer.getvalue(), self.non_tensor_batch, self.meta_info

    return __getstate__
