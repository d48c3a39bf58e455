"""What the driver ships per worker call (vendor item A2 with D2D): pure key sets and the DataProtos."""

from __future__ import annotations

import pytest
import torch

from verl_patches.worker_calls.step_payloads import NEVER_SHIPPED_WITH_D2D, payload_keys, ref_payload, update_payload

KEYS = [
    "prompts",
    "responses",
    "attention_mask",
    "input_ids",
    "position_ids",
    "ref_log_prob",
    "old_log_probs",
    "advantages",
    "token_level_scores",
]


@pytest.mark.parametrize("call", ["compute_ref_log_prob", "update_actor"])
def test_without_d2d_everything_is_shipped(call: str) -> None:
    assert payload_keys(call, KEYS, d2d=False) == KEYS


def test_with_d2d_ref_gets_nothing_and_update_only_advantages() -> None:
    assert payload_keys("compute_ref_log_prob", KEYS, d2d=True) == []
    assert payload_keys("update_actor", KEYS, d2d=True) == ["advantages"]
    for call in ("compute_ref_log_prob", "update_actor"):
        assert not set(payload_keys(call, KEYS, True)) & set(NEVER_SHIPPED_WITH_D2D)


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="unknown call"):
        payload_keys("generate_sequences", KEYS, True)
    with pytest.raises(KeyError, match="advantages"):
        payload_keys("update_actor", ["responses"], True)


def test_dataprotos_keep_size_and_meta_info() -> None:
    from verl import DataProto

    batch = DataProto.from_dict({k: torch.zeros(6, 2) for k in KEYS}, meta_info={"global_token_num": [3] * 6})
    assert ref_payload(batch, False) is batch and update_payload(batch, False) is batch
    ref = ref_payload(batch, True)
    assert len(ref) == 6 and list(ref.batch.keys()) == [] and ref.meta_info == batch.meta_info
    upd = update_payload(batch, True)
    assert len(upd) == 6 and list(upd.batch.keys()) == ["advantages"] and upd.meta_info["global_token_num"] == [3] * 6
    upd.meta_info["x"] = 1
    assert "x" not in batch.meta_info  # a copy: the worker call cannot change the driver's batch
    assert [len(c) for c in ref.chunk(3)] == [2, 2, 2]  # verl's dispatch splits it like any batch
