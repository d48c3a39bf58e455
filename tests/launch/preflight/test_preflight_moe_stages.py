"""A pipeline stage without a MoE layer would hang the first update: the preflight refuses the split."""

from __future__ import annotations

import itertools

import pytest

from verl_patches.launch.preflight.findings import FAIL, OK
from verl_patches.launch.preflight.layout import layer_list_findings
from verl_patches.train_engine.stages import dense_only_message, dense_only_stages, stage_layer_ranges

KEY = "actor_rollout_ref.actor.megatron.pipeline_parallel_num_layer_list"


def _cfg(lst):
    return {"actor_rollout_ref": {"actor": {"megatron": {"pipeline_parallel_num_layer_list": lst}}}}


def test_the_a3_split_keeps_a_moe_layer_on_every_stage() -> None:
    assert dense_only_stages([7, 7, 8, 8, 8, 8, 8, 7], 3, 256) == []
    (f,) = layer_list_findings(
        _cfg([7, 7, 8, 8, 8, 8, 8, 7]),
        {"num_hidden_layers": 61, "first_k_dense_replace": 3, "n_routed_experts": 256},
        8,
    )
    assert f.status == OK


@pytest.mark.parametrize("counts", [c for n in (2, 3) for c in itertools.product(range(1, 6), repeat=n)])
@pytest.mark.parametrize("dense", [0, 1, 3, 5])
def test_dense_only_stages_are_exactly_those_ending_before_the_first_moe_layer(counts, dense) -> None:
    counts = list(counts)
    expected = [s for s, r in enumerate(stage_layer_ranges(counts)) if all(layer < dense for layer in r)]
    assert dense_only_stages(counts, dense, 8) == expected
    assert dense_only_stages(counts, dense, 0) == []  # a dense model has no expert reduction to miss


def test_preflight_names_the_stage_and_the_key() -> None:
    model = {"num_hidden_layers": 5, "first_k_dense_replace": 3, "n_routed_experts": 256}
    (f,) = layer_list_findings(_cfg([2, 3]), model, 2)
    assert f.status == FAIL and f.key == KEY
    assert "stage 0 (layers 0..1) hold only dense layers (first_k_dense_replace=3)" in f.message
    (ok,) = layer_list_findings(_cfg([4, 1]), model, 2)
    assert ok.status == OK
    assert dense_only_message([1, 1, 3], 2, [0, 1]).startswith(
        "layer list [1, 1, 3]: stage 0 (layers 0..0), stage 1 (layers 1..1) hold only dense layers"
    )
