"""vLLM 0.9.1's DeepSeek-V2/V3 parameter layout, taken from vLLM itself (not re-typed).

- The stacked mapping (gate_proj/up_proj -> gate_up_proj, shard ids 0/1) is the literal
  `stacked_params_mapping` of `DeepseekV2ForCausalLM.load_weights`, read from vLLM's source at the pin.
- Expert names come from `FusedMoE.make_expert_params_mapping` (w1/w3 -> experts.w13_weight, w2 ->
  experts.w2_weight) and the EP-local experts from `determine_expert_map`, both called at run time.
- Loading itself runs vLLM's unmodified `DeepseekV2ForCausalLM.load_weights` (model.py), so the names
  and shapes accepted are exactly vLLM's (vllm-ascend's override additionally drops names containing
  ".module."; so do we).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from functools import lru_cache

import torch


@lru_cache(maxsize=1)
def stacked_params_mapping() -> tuple[tuple[str, str, int], ...]:
    """(param_name, shard_name, shard_id) as vLLM's DeepSeek loader declares it at the pin."""
    # deferred: importing this module must not load vLLM; it loads once the prelude patched it
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM

    tree = ast.parse(textwrap.dedent(inspect.getsource(DeepseekV2ForCausalLM.load_weights)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "stacked_params_mapping" for t in node.targets):
            return tuple(tuple(x) for x in ast.literal_eval(node.value))
    raise LookupError("vLLM's DeepseekV2ForCausalLM.load_weights no longer defines stacked_params_mapping")


def expert_params_mapping(num_experts: int) -> list[tuple[str, str, int, str]]:
    # deferred: importing this module must not load vLLM; it loads once the prelude patched it
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE

    return FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name="gate_proj",
        ckpt_down_proj_name="down_proj",
        ckpt_up_proj_name="up_proj",
        num_experts=num_experts,
    )


def local_experts(num_experts: int, ep_size: int, ep_rank: int) -> list[int]:
    """Global ids of the experts rank `ep_rank` serves, by vLLM's own expert map."""
    if ep_size == 1:
        return list(range(num_experts))
    # deferred: importing this module must not load vLLM; it loads once the prelude patched it
    from vllm.model_executor.layers.fused_moe.layer import determine_expert_map

    _, expert_map = determine_expert_map(ep_size, ep_rank, num_experts)
    return [e for e in range(num_experts) if int(expert_map[e]) >= 0]


@dataclass(frozen=True)
class Slot:
    """Where an HF tensor lives inside a vLLM parameter: vLLM name, index along dim 0 (local expert or
    None), row range of the (possibly stacked) matrix."""

    vllm_name: str
    expert: int | None
    rows: tuple[int, int] | None


def vllm_layout(
    hf_shapes: dict[str, torch.Size], num_experts: int, experts: list[int]
) -> tuple[dict[str, tuple[int, ...]], dict[str, Slot]]:
    """vLLM parameter shapes (TP 1, EP-local experts) and, per HF parameter name held here, its slot.

    Names are mapped with vLLM's own tables in vLLM's order (stacked first, then experts, else as is);
    HF expert tensors of experts this rank does not serve are simply not held.
    """
    stacked = stacked_params_mapping()
    expert_map = expert_params_mapping(num_experts)
    local_index = {e: i for i, e in enumerate(experts)}
    shapes: dict[str, list[int]] = {}
    slots: dict[str, Slot] = {}
    for name, shape in hf_shapes.items():
        if ".mlp.experts." not in name:
            hit = next(((p, w, s) for p, w, s in stacked if w in name), None)
            if hit is not None:
                p, w, sid = hit
                vname = name.replace(w, p)
                rows = shape[0]
                shapes.setdefault(vname, [0, *shape[1:]])
                start = sid * rows  # gate then up, each `rows` rows (TP 1)
                shapes[vname][0] = max(shapes[vname][0], start + rows)
                slots[name] = Slot(vname, None, (start, start + rows))
                continue
            shapes[name] = list(shape)
            slots[name] = Slot(name, None, None)
            continue
        hit = next(((p, w, e, s) for p, w, e, s in expert_map if w in name), None)
        if hit is None:
            raise LookupError(f"{name}: no vLLM expert mapping for this HF expert parameter")
        p, w, e, sid = hit
        if e not in local_index:
            continue
        vname = name.replace(w, p)
        rows = shape[0]
        if sid == "w2":
            shapes.setdefault(vname, [len(experts), *shape])
            slots[name] = Slot(vname, local_index[e], None)
        else:
            start = 0 if sid == "w1" else rows
            shapes.setdefault(vname, [len(experts), 2 * rows, *shape[1:]])
            slots[name] = Slot(vname, local_index[e], (start, start + rows))
    return {k: tuple(v) for k, v in shapes.items()}, slots
