"""Graph-decode token counting (verl_patches.rollout.decode_share): per request and step kind, mapped to verl's
response order (vLLM V1's child request ids for n > 1), attached to the rollout's output and turned into the
step's share by the driver."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_patches.rollout import decode_share as ds


def _runner(graph_mode: bool, with_prefill: bool) -> SimpleNamespace:
    return SimpleNamespace(torchair_graph_enabled=graph_mode, with_prefill=with_prefill)


def _step(req_ids: list[str], sampled: list[list[int]]) -> SimpleNamespace:
    return SimpleNamespace(req_ids=req_ids, sampled_token_ids=sampled)


def test_graph_step_needs_graph_mode_and_no_prefill() -> None:
    assert ds.is_graph_step(_runner(True, False))
    assert not ds.is_graph_step(_runner(True, True))
    assert not ds.is_graph_step(_runner(False, False))
    assert not ds.is_graph_step(SimpleNamespace())  # a runner that never ran a step


def test_wrapped_execute_model_counts_each_kind_of_step() -> None:
    """A prefill chunk that samples nothing is not counted; a mixed step (prefill + decodes) is eager."""
    plan = iter(
        [
            (True, _step(["0_a", "1_a"], [[], [5]])),  # chunked prefill: 0_a's chunk samples nothing
            (True, _step(["0_a", "1_a"], [[7], [8]])),  # mixed step: eager
            (False, _step(["0_a", "1_a"], [[9], [2]])),  # graph decode
            (False, _step(["0_a"], [[2]])),  # graph decode, 1_a finished
        ]
    )
    runner = _runner(True, True)

    def execute_model(self: SimpleNamespace, scheduler_output: object) -> SimpleNamespace:
        prefill, out = next(plan)
        self.with_prefill = prefill
        return out

    wrapped = ds.wrap_execute_model(execute_model)
    for _ in range(4):
        wrapped(runner, None)
    counts = ds.counts_of(runner)
    assert counts.pop("0_a") == (2, 1)
    assert counts.pop("1_a") == (1, 2)
    assert counts.pop("1_a") == (0, 0)  # forgotten once read


def test_empty_step_output_is_ignored() -> None:
    runner = _runner(True, False)
    ds.wrap_execute_model(lambda self, so: SimpleNamespace(req_ids=[], sampled_token_ids=[]))(runner, None)
    assert ds.counts_of(runner).graph == {}


def _outputs(parents: list[str], n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(request_id=p, outputs=[SimpleNamespace(index=i) for i in range(n)]) for p in parents]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parents=st.integers(1, 5), n=st.integers(1, 4), data=st.data())
def test_per_response_counts_follow_verls_order(parents: int, n: int, data: st.DataObject) -> None:
    ids = [str(10 + p) for p in range(parents)]
    outputs = _outputs(ids, n)
    expected = []
    counts = ds.DecodeCounts()
    for p in ids:
        for i in range(n):
            g = data.draw(st.integers(0, 9))
            e = data.draw(st.integers(0, 3))
            req = f"{i}_{p}" if n > 1 else p
            for _ in range(g):
                counts.record([req], [[1]], graph_step=True)
            for _ in range(e):
                counts.record([req], [[1]], graph_step=False)
            expected.append(g)
    assert ds.per_response_counts(counts, outputs, n) == expected
    assert counts.graph == {} and counts.eager == {}  # every request read is forgotten


class _FakeLLM:
    def generate(self, prompts: list, sampling_params: object = None, **kw: object) -> list:
        return _outputs(["0", "1"], sampling_params.n)


class _FakeProto:
    def __init__(self, rows: int) -> None:
        self.batch = _Batch(rows)


class _Batch(dict):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.batch_size = torch.Size([rows])


def test_capture_and_attach_put_one_count_per_row() -> None:
    llm = _FakeLLM()
    runner = _runner(True, False)
    counts = ds.counts_of(runner)
    counts.record(["0_0", "1_0", "0_1", "1_1"], [[1], [1], [1], [1]], graph_step=True)
    counts.record(["1_1"], [[1]], graph_step=True)
    counts.record(["orphan"], [[1]], graph_step=True)  # aborted: never an output
    with ds.captured_generate(llm) as calls:
        llm.generate(["p", "q"], sampling_params=SimpleNamespace(n=2))
    assert "generate" not in vars(llm)  # the instance is as before
    out = _FakeProto(4)
    ds.attach_counts(out, runner, calls)
    assert out.batch[ds.BATCH_KEY].tolist() == [1.0, 1.0, 1.0, 2.0]
    assert counts.graph == {}  # nothing carried to the next generate


def test_attach_refuses_rows_that_do_not_match() -> None:
    llm = _FakeLLM()
    runner = _runner(True, False)
    ds.counts_of(runner)
    with ds.captured_generate(llm) as calls:
        llm.generate(["p"], sampling_params=SimpleNamespace(n=1))
    with pytest.raises(RuntimeError, match="2 engine responses for 3 rows"):
        ds.attach_counts(_FakeProto(3), runner, calls)


def test_attach_without_counts_leaves_the_output_alone() -> None:
    out = _FakeProto(2)
    ds.attach_counts(out, None, [])
    ds.attach_counts(out, SimpleNamespace(), [(_outputs(["0"], 2), 2)])
    assert ds.BATCH_KEY not in out.batch


def test_share_metrics_from_the_batch() -> None:
    from tensordict import TensorDict

    batch = SimpleNamespace(
        batch=TensorDict(
            {
                ds.BATCH_KEY: torch.tensor([8.0, 0.0, 6.0]),
                "response_mask": torch.tensor([[1] * 9 + [0] * 3, [1] * 2 + [0] * 10, [1] * 7 + [0] * 5]),
            },
            batch_size=[3],
        )
    )
    metrics = ds.share_metrics(batch)
    assert metrics[ds.SHARE] == pytest.approx(14 / 18)
    assert metrics[ds.GRAPH_TOKENS] == 14 and metrics[ds.SAMPLED_TOKENS] == 18
    assert ds.BATCH_KEY not in batch.batch.keys()  # no worker needs it
    assert ds.share_metrics(batch) == {}  # absent: nothing to report


def test_modelled_share_hand_computed_cases() -> None:
    # the tiny run: 128 prompts of 40 tokens, budget 3072: step 1 completes 76 prompts (they sample), step 2 is
    # mixed (76 decodes + the other 52 prompts): 204 eager tokens of 128 x 9
    assert ds.modelled_share(128, 40, 3072, 9) == pytest.approx((128 * 9 - 204) / (128 * 9))
    # every prompt in one step: only the first token of each response is eager
    assert ds.modelled_share(8, 10, 80, 5) == pytest.approx(4 / 5)
    # a prompt longer than the budget is chunked over steps that sample nothing
    assert ds.modelled_share(1, 100, 30, 3) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="positive"):
        ds.modelled_share(0, 1, 1, 1)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seqs=st.integers(1, 12), prompt=st.integers(1, 30), budget=st.integers(1, 200), response=st.integers(1, 20))
def test_modelled_share_properties(seqs: int, prompt: int, budget: int, response: int) -> None:
    share = ds.modelled_share(seqs, prompt, budget, response)
    assert 0.0 <= share <= (response - 1) / response + 1e-12  # each response's first token comes from a prefill step
    if budget >= seqs * prompt:
        assert share == pytest.approx((response - 1) / response)
