"""TorchAir graphs and the rollout's moving weights.

vllm-ascend 0.9.1 compiles the model for TorchAir with `frozen_parameter = True`: each `nn.Parameter`'s
device address is bound at a graph's first run and never read again, and dynamo (torch 2.5.1) neither
guards on nor recompiles for a replaced `param.data`. The lifecycle (lifecycle.py) releases the weights'
device memory for training and gives them new storage before each weight sync, so a frozen graph built
before would decode from freed (soon reused) memory: garbage tokens, no error.

Design: the declared patch `vllm_ascend.model_runner_v1.torchair_unfrozen_parameters`
(patches/vllm_ascend/worker/unfrozen_parameters.py) builds the graphs with `frozen_parameter = False`, so
the weights are graph inputs read at every run and graphs stay valid wherever the weights move; it marks its
builder (`FROZEN_ATTR`), and `graphs_freeze_parameters` reads that mark. For a model runner whose graphs
still freeze parameters (the patch off, or a runner class it does not reach), the addresses the graphs were
built with are recorded on the runner (`record`), and before the rollout generates again (`init_cache_engine`)
`forget_graphs_if_moved` compares them with the parameters' current storage; if any moved, dynamo's caches
and the runner's compiled models are dropped, so vllm-ascend compiles the graphs again on the new addresses.
Costs of both on A3 (docs/a3-cluster-guide.md, the preflight's `memory.rollout_weight_lifecycle`): unfrozen, a
refresh of the weights' addresses at every graph run; frozen, one TorchAir compile per step.

On a CPU host the emulated TorchAir backend (npu_emulation/site/torchair) raises `FrozenParameterMoved`,
naming the parameter, if a frozen graph ever runs on moved weights: the contract is checked, not assumed.
"""

from __future__ import annotations

from typing import Any

import torch

ATTR = "_verl_patches_graph_weight_addresses"
FROZEN_ATTR = "verl_patches_frozen_parameter"  # set False on vllm-ascend's graph builder by our patch


def graphs_freeze_parameters(runner: Any) -> bool:
    """Whether `runner`'s TorchAir graphs bind parameter addresses at their first run: True unless its class
    builds them through the unfrozen-parameters patch (patches/vllm_ascend/worker/unfrozen_parameters.py)."""
    method = getattr(type(runner), "_get_torchair_lazy_compiled_model", None)
    return bool(getattr(method, FROZEN_ATTR, True))


def weight_addresses(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """name -> (storage base, element offset) of every parameter: what a frozen-parameter graph binds."""
    return {n: (p.untyped_storage().data_ptr(), p.storage_offset()) for n, p in model.named_parameters()}


def has_graphs(runner: Any) -> bool:
    return bool(getattr(runner, "torchair_compiled_model", None)) or bool(
        getattr(runner, "torchair_compiled_models", None)
    )


def record(runner: Any) -> None:
    """The runner's graphs are (or will be) built on the parameters' current addresses."""
    setattr(runner, ATTR, weight_addresses(runner.model))


def moved_parameters(runner: Any) -> list[str]:
    """Parameters whose storage differs from the recorded addresses (all of them when none is recorded)."""
    bound = getattr(runner, ATTR, None)
    now = weight_addresses(runner.model)
    if bound is None:
        return list(now)
    return [n for n, a in now.items() if bound.get(n) != a]


def forget_graphs_if_moved(runner: Any) -> list[str]:
    """Drop the runner's TorchAir graphs if they froze other weight addresses; returns the moved parameters
    (empty: nothing dropped). The next capture or decode compiles them on today's addresses. Graphs that take
    the weights as inputs (the unfrozen-parameters patch) are kept: they read wherever the weights are."""
    if not graphs_freeze_parameters(runner):
        return []
    if not has_graphs(runner):
        record(runner)  # graphs built from now on bind the current addresses
        return []
    moved = moved_parameters(runner)
    if moved:
        torch._dynamo.reset()  # dynamo would hand back the graph cached for this code object
        runner.torchair_compiled_model = None
        compiled = getattr(runner, "torchair_compiled_models", None)
        if compiled is not None:
            compiled.clear()
        record(runner)
    return moved
