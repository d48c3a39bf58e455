"""The pure measures of bench/bench_bf16_mismatch.py: engine-step rows mapped to (request, position), TP ranks'
routing rows merged in vllm-ascend's split order, routing flips counted per token and per layer, and the
log-prob band (the run's own metrics plus p99, share above 1 nat, share of TIS weights capped). The benchmark
itself runs both engines (minutes); these are what its numbers are computed with."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bench_bf16_mismatch import (
    COLUMNS,
    logprob_band,
    merge_tp_taps,
    report_lines,
    rollout_routes,
    routing_flips,
    step_rows,
)
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF, ABS_DIFF_MAX


def test_step_rows_follow_the_runners_request_order() -> None:
    assert step_rows(["b", "a"], [2, 1], [5, 6, 9]) == [("b", 5), ("b", 6), ("a", 9)]
    with pytest.raises(ValueError, match="3 scheduled tokens but 2 positions"):
        step_rows(["b", "a"], [2, 1], [5, 6])


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 80), tp=st.integers(1, 4), layers=st.integers(1, 3))
def test_tp_ranks_rows_merge_back_into_the_steps_rows(rows: int, tp: int, layers: int) -> None:
    full = [[[layer, r] for r in range(rows)] for layer in range(layers)]
    # what each TP rank routes: its torch.tensor_split chunk of the step's (padded) rows, per layer
    per_rank = [
        [torch.tensor_split(torch.tensor(full[layer]), tp, dim=0)[t].tolist() for layer in range(layers)]
        for t in range(tp)
    ]
    assert merge_tp_taps(per_rank) == full


def test_rollout_routes_map_prefill_chunks_and_padded_graph_decodes() -> None:
    steps = [
        # a prefill chunk of request "0" (positions 0-2) beside the first token of "1"
        {
            "req_ids": ["0", "1"],
            "counts": [3, 1],
            "positions": [0, 1, 2, 0],
            "taps": [[[1, 2], [2, 3], [3, 4], [4, 5]]],
        },
        # a graph decode: one token each, rows padded to the graph batch size (the padding is not mapped)
        {"req_ids": ["1", "0"], "counts": [1, 1], "positions": [1, 3], "taps": [[[6, 5], [8, 7], [0, 0], [0, 0]]]},
    ]
    assert rollout_routes(steps, 1) == {
        "0": {0: [[1, 2]], 1: [[2, 3]], 2: [[3, 4]], 3: [[7, 8]]},
        "1": {0: [[4, 5]], 1: [[5, 6]]},
    }
    with pytest.raises(ValueError, match="2 routing decisions for 1 MoE layers"):
        rollout_routes([dict(steps[0], taps=steps[0]["taps"] * 2)], 1)
    with pytest.raises(ValueError, match="1 routed rows for 4 scheduled tokens"):
        rollout_routes([dict(steps[0], taps=[[[1, 2]]])], 1)


def test_routing_flips_count_tokens_layers_and_the_response() -> None:
    rollout = {0: [[1, 2], [3, 4]], 1: [[1, 2], [3, 5]], 2: [[7, 8], [3, 4]]}
    train = [[[2, 1], [1, 2], [8, 6]], [[4, 3], [3, 4], [4, 3]]]  # order within a set does not matter
    counts, flipped = routing_flips(rollout, train, first_response=2)
    assert flipped == {1, 2}
    assert counts == dict(tokens=3, flipped=2, response_tokens=1, response_flipped=1, pairs=6, flipped_pairs=2)


def test_logprob_band_uses_the_runs_metrics_and_adds_the_bands_shape() -> None:
    rollout = torch.zeros(1, 100, dtype=torch.float64)
    delta = torch.linspace(-1.5, 1.5, 100, dtype=torch.float64)
    band = logprob_band(rollout + delta, rollout, torch.ones(1, 100))
    assert band[ABS_DIFF] == pytest.approx(float(delta.abs().mean()))
    assert band[ABS_DIFF_MAX] == pytest.approx(1.5)
    assert band["p99_abs_diff"] == pytest.approx(float(torch.quantile(delta.abs(), 0.99)))
    assert band["share_above_1_nat"] == pytest.approx(float((delta.abs() > 1).double().mean()))
    assert band["share_tis_capped"] == pytest.approx(float((delta > math.log(2.0)).double().mean()))


def test_the_report_shows_a_class_without_tokens_as_a_dash() -> None:
    row = {key: 0.5 for _, key, _ in COLUMNS} | {"routed_tokens": 10.0}
    fp32 = dict(row, mean_abs_diff_at_flips=None)  # no flip: no mean gap at flips
    lines = report_lines({"bfloat16": row, "float32": fp32})
    assert lines[2].split()[0] == "float32" and lines[2].split().count("-") == 1
    assert lines[3].startswith("bf16 / fp32 mean")
