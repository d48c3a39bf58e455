"""Which sampled tokens came from TorchAir graph decode steps: ``rollout/graph_decode_token_share``.

On A3 about 99 % of a rollout's tokens are graph decodes: a handful of chunked-prefill steps, then ~3000 decode
steps through the compiled TorchAir graph (MC2, fused attention). vllm-ascend's model runner runs a step through
the graph when graph mode is on and no rank of its DP group holds a prefill chunk (``with_prefill`` is
all-reduced over DP, so one prefill anywhere makes the whole group's step eager); every other step is eager. A
CPU proof whose tokens come from eager steps proves the prefill path only, so the share is counted, logged every
step and held by the golden check.

How: the model runner's ``execute_model`` (declared wrap, `wrap_execute_model`) records per request how many of
the tokens it sampled came from a graph step (`DecodeCounts`); verl's ``vLLMRollout.generate_sequences`` (the
rollout's declared wrap, `verl_hooks`) captures the engine's outputs and returns one number per response,
``rollout_graph_decode_tokens`` (`per_response_counts`), so the count follows its response through every split
and gather of the batch; the driver turns the batch's sums into the metrics (`share_metrics`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

BATCH_KEY = "rollout_graph_decode_tokens"
SHARE = "rollout/graph_decode_token_share"
GRAPH_TOKENS = "rollout/graph_decode_tokens"
SAMPLED_TOKENS = "rollout/sampled_tokens"
_ATTR = "_verl_patches_decode_counts"


@dataclass
class DecodeCounts:
    """Per engine request id: tokens sampled in graph steps and in eager steps."""

    graph: dict[str, int] = field(default_factory=dict)
    eager: dict[str, int] = field(default_factory=dict)

    def record(self, req_ids: Sequence[str], sampled: Sequence[Sequence[int]], graph_step: bool) -> None:
        """One engine step: `sampled[i]` are the tokens request `req_ids[i]` sampled (empty for a prefill chunk
        that samples nothing)."""
        into = self.graph if graph_step else self.eager
        for req_id, tokens in zip(req_ids, sampled):
            if tokens:
                into[req_id] = into.get(req_id, 0) + len(tokens)

    def pop(self, req_id: str) -> tuple[int, int]:
        """(graph, eager) tokens of a finished request, forgotten afterwards."""
        return self.graph.pop(req_id, 0), self.eager.pop(req_id, 0)

    def clear(self) -> None:
        self.graph.clear()
        self.eager.clear()


def counts_of(runner: Any) -> DecodeCounts:
    """The counts kept on a model runner (made on first use)."""
    counts = getattr(runner, _ATTR, None)
    if counts is None:
        counts = DecodeCounts()
        setattr(runner, _ATTR, counts)
    return counts


def is_graph_step(runner: Any) -> bool:
    """The step the runner just ran went through the TorchAir graph: graph mode on and no prefill in its DP
    group (the runner keeps the DP-reduced flag of its last step in ``with_prefill``)."""
    return bool(getattr(runner, "torchair_graph_enabled", False)) and not bool(getattr(runner, "with_prefill", True))


def wrap_execute_model(original: Callable[..., Any]) -> Callable[..., Any]:
    """vllm-ascend's ``NPUModelRunner.execute_model``, recording which kind of step sampled each token."""

    @functools.wraps(original)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        req_ids, sampled = getattr(out, "req_ids", None), getattr(out, "sampled_token_ids", None)
        if req_ids and sampled is not None:
            counts_of(self).record(req_ids, sampled, is_graph_step(self))
        return out

    return execute_model


def engine_request_ids(outputs: Sequence[Any], n: int) -> list[str]:
    """The engine's request id of every response, in the order verl's rollout reads them (each output's
    completions in turn). vLLM V1 runs a request with n > 1 as n child requests ``f"{index}_{request_id}"``."""
    ids = []
    for output in outputs:
        for completion in output.outputs:
            ids.append(f"{completion.index}_{output.request_id}" if n > 1 else str(output.request_id))
    return ids


def per_response_counts(counts: DecodeCounts, outputs: Sequence[Any], n: int) -> list[int]:
    """Graph-decoded tokens of each response (verl's order); the requests are forgotten afterwards."""
    return [counts.pop(req_id)[0] for req_id in engine_request_ids(outputs, n)]


@contextlib.contextmanager
def captured_generate(llm: Any) -> Iterator[list[tuple[Any, int]]]:
    """Within the block, every ``llm.generate`` call appends (its outputs, its sampling params' n)."""
    calls: list[tuple[Any, int]] = []
    original = llm.generate

    @functools.wraps(original)
    def generate(*args: Any, **kwargs: Any) -> Any:
        outputs = original(*args, **kwargs)
        params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
        calls.append((outputs, int(getattr(params, "n", 1) or 1)))
        return outputs

    llm.generate = generate
    try:
        yield calls
    finally:
        del llm.generate  # the instance attribute goes; the class's method shows again


def attach_counts(output: Any, runner: Any, calls: list[tuple[Any, int]]) -> None:
    """Put ``BATCH_KEY`` into verl's generate output (a DataProto): one count per response row. Left out when the
    engine keeps no counts (the rollout stand-in) or the rows do not match the captured outputs."""
    # lazy: torch is heavy; importing this module must not load it
    import torch

    counts = getattr(runner, _ATTR, None) if runner is not None else None
    if counts is None or len(calls) != 1:
        return
    outputs, n = calls[0]
    values = per_response_counts(counts, outputs, n)
    counts.clear()  # requests that never reached an output (aborted) are not carried to the next generate
    rows = output.batch.batch_size[0]
    if len(values) != rows:
        raise RuntimeError(
            f"graph-decode counts: {len(values)} engine responses for {rows} rows of the rollout's output"
        )
    output.batch[BATCH_KEY] = torch.tensor(values, dtype=torch.float32)


def share_metrics(batch: Any) -> dict[str, float]:
    """The step's metrics from a batch that carries ``BATCH_KEY`` (popped: no worker needs it), {} otherwise.
    The share is over the response tokens (``response_mask``), which are the sampled tokens."""
    if BATCH_KEY not in batch.batch.keys():
        return {}
    graph = float(batch.batch[BATCH_KEY].sum())
    del batch.batch[BATCH_KEY]
    sampled = float(batch.batch["response_mask"].sum())
    if sampled <= 0:
        return {GRAPH_TOKENS: graph, SAMPLED_TOKENS: sampled}
    return {SHARE: graph / sampled, GRAPH_TOKENS: graph, SAMPLED_TOKENS: sampled}


def modelled_share(seqs: int, prompt_tokens: int, budget: int, response_tokens: int) -> float:
    """The graph-decode share of one engine's rollout as vLLM V1's chunked-prefill scheduler runs it (pure):
    `seqs` prompts of `prompt_tokens` arrive together, every response is `response_tokens` long, each step has
    `budget` tokens; running requests (decodes, then the prompt being chunked) go first, waiting prompts fill
    the rest. A step that holds any prefill chunk is eager (all DP ranks alike); a request samples a token in the
    step that completes its prompt and in each decode step after."""
    if min(seqs, prompt_tokens, budget, response_tokens) <= 0:
        raise ValueError("modelled_share: every argument must be positive")
    left = [prompt_tokens] * seqs  # prompt tokens still to prefill, per request
    sampled = [0] * seqs
    graph = eager = 0
    while any(s < response_tokens for s in sampled):
        room, prefill_in_step, samplers = budget, False, []
        for i in range(seqs):  # vLLM schedules in arrival order: decodes and the partial prompt, then new ones
            if sampled[i] >= response_tokens or room == 0:
                continue
            if left[i] == 0:
                room -= 1
                samplers.append(i)
                continue
            chunk = min(left[i], room)
            left[i] -= chunk
            room -= chunk
            prefill_in_step = True
            if left[i] == 0:
                samplers.append(i)
        for i in samplers:
            sampled[i] += 1
        if prefill_in_step:
            eager += len(samplers)
        else:
            graph += len(samplers)
    return graph / (graph + eager)
