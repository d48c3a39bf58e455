"""verl.protocol.union_tensor_dict with a locked left side (vendor item C7), directly and as the patch
installs it (DataProto.union resolves the module global)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from verl_patches.patches.verl.protocol import union_tensor_dict


def test_locked_tensor_dict_takes_new_keys_and_stays_locked() -> None:
    td = TensorDict({}, batch_size=[4]).lock_()
    out = union_tensor_dict(td, TensorDict({"x": torch.ones(4, 2)}, batch_size=[4]))
    assert out is td and td.is_locked and torch.equal(td["x"], torch.ones(4, 2))


def test_unlocked_stays_unlocked() -> None:
    td = TensorDict({"a": torch.zeros(4)}, batch_size=[4])
    union_tensor_dict(td, TensorDict({"x": torch.ones(4)}, batch_size=[4]))
    assert not td.is_locked and set(td.keys()) == {"a", "x"}


def test_equal_duplicate_passes_unequal_fails_without_partial_insert() -> None:
    td = TensorDict({"a": torch.zeros(4)}, batch_size=[4]).lock_()
    union_tensor_dict(td, TensorDict({"a": torch.zeros(4)}, batch_size=[4]))
    with pytest.raises(AssertionError, match="a in tensor_dict1"):
        union_tensor_dict(td, TensorDict({"x": torch.ones(4), "a": torch.ones(4)}, batch_size=[4]))
    assert set(td.keys()) == {"a"} and td.is_locked


def test_batch_size_mismatch() -> None:
    with pytest.raises(AssertionError, match="identical batch size"):
        union_tensor_dict(TensorDict({}, batch_size=[4]), TensorDict({}, batch_size=[3]))


def test_patched_dataproto_union_with_locked_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    import verl.protocol as protocol
    from verl import DataProto

    monkeypatch.setattr(protocol, "union_tensor_dict", union_tensor_dict)
    empty = DataProto(batch=TensorDict({}, batch_size=[4]).lock_())
    out = empty.union(DataProto.from_dict({"responses": torch.ones(4, 3)}))
    assert list(out.batch.keys()) == ["responses"] and len(out) == 4
