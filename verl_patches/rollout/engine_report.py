"""What generated: the rollout engine's classes and modes, read from the built engine (not from the config).

`describe(llm)` names the worker, model runner, model, attention and MoE implementations, the sampler and its
top-k/top-p function, TorchAir graph mode and whether its graphs are compiled, the dtype, the number of
parameter tensors (what an unfrozen graph takes as inputs at every run), and vLLM's parallel groups;
`report_line` is the one line the job log carries per engine, so a log says which engine produced its tokens
(vllm-ascend's on A3 and on a CPU host; the stand-in only where a test opts into it).
"""

from __future__ import annotations

from typing import Any


def _name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _groups() -> dict[str, int]:
    try:
        # deferred: importing this module must not load vLLM; it loads once the prelude patched it
        from vllm.distributed import parallel_state as ps
    except ImportError:
        return {}
    if not ps.model_parallel_is_initialized():
        return {}
    return {"tp": ps.get_tp_group().world_size, "dp": ps.get_dp_group().world_size, "ep": ps.get_ep_group().world_size}


def describe(llm: Any) -> dict[str, Any]:
    # lazy: these modules load torch; importing this one must not
    from verl_patches.rollout.graph_binding import has_graphs
    from verl_patches.rollout.lifecycle import model_runner_of

    runner = model_runner_of(llm)
    worker = llm.llm_engine.model_executor.driver_worker.worker
    model = runner.model
    sampler = getattr(runner, "sampler", None)
    topk = getattr(getattr(sampler, "topk_topp_sampler", None), "forward", None)
    return {
        "worker": _name(worker),
        "model_runner": _name(runner),
        "model": _name(model),
        "attention_impls": sorted({_name(m.impl) for m in model.modules() if hasattr(m, "impl")}),
        "moe": sorted({_name(m) for m in model.modules() if type(m).__name__.endswith("FusedMoE")}),
        "sampler": _name(sampler) if sampler is not None else None,
        "top_k_top_p": getattr(getattr(topk, "__func__", topk), "__module__", None),
        "torchair_graph_enabled": bool(getattr(runner, "torchair_graph_enabled", False)),
        "graphs_compiled": has_graphs(runner),
        "device": str(getattr(runner, "device", "")),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "parameter_tensors": sum(1 for _ in model.parameters()),  # a graph's weight inputs, per run
        "groups": _groups(),
    }


def report_line(desc: dict[str, Any]) -> str:
    graph = (
        "TorchAir graph mode, graphs compiled"
        if desc["graphs_compiled"]
        else ("TorchAir graph mode, graphs not compiled yet" if desc["torchair_graph_enabled"] else "eager")
    )
    groups = desc.get("groups") or {}
    par = f"EP {groups.get('ep', 1)} (DP {groups.get('dp', 1)} x TP {groups.get('tp', 1)})"
    return (
        f"verl_patches rollout engine: {desc['model_runner']} running {desc['model']} on {desc['device']} "
        f"({desc['dtype']}), {graph}, {par}; attention {', '.join(desc['attention_impls']) or '-'}; "
        f"MoE {', '.join(desc['moe']) or '-'}; sampler {desc['sampler']} with top-k/top-p from {desc['top_k_top_p']}"
    )
