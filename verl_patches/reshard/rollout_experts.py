"""What the rollout side hands vLLM's loader after the expert reshard.

For one MoE layer and one weight kind the rollout rank yields one entry per expert and projection, in
expert order: ``weight1`` → ``(e, "gate_proj", t), (e, "up_proj", t)`` for every expert ``e``
(``2*num_experts`` entries, gate first), ``weight2`` → ``(e, "down_proj", t)`` (``num_experts`` entries).
``t`` is a real tensor for the experts this rank owns (``gate/up [ffn, hidden]``, ``down [hidden, ffn]``,
transposed *views* of the received blocks) and a zero-size tensor for every other expert; vLLM's
expert-parallel loader skips experts not in its expert map, so those are never read.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from verl_patches.reshard.ep_plan import ExpertWeight

PROJECTIONS = {ExpertWeight.WEIGHT1: ("gate_proj", "up_proj"), ExpertWeight.WEIGHT2: ("down_proj",)}


def rollout_expert_slots(kind: ExpertWeight, num_experts: int, owned: range) -> list[tuple[int, str, bool]]:
    """Pure form: ``(expert, projection, is_owned)`` in the order the rollout yields them."""
    return [(e, proj, e in owned) for e in range(num_experts) for proj in PROJECTIONS[ExpertWeight(kind)]]


def rollout_expert_tensors(
    kind: ExpertWeight,
    blocks: Mapping[int, torch.Tensor],
    num_experts: int,
    ffn: int,
    empty_like: torch.Tensor | None = None,
) -> list[tuple[int, str, torch.Tensor]]:
    """Turn training-orientation expert blocks into the rollout's per-projection tensors.

    ``blocks[e]`` is ``[hidden, 2*ffn]`` (gate‖up) for ``weight1`` or ``[ffn, hidden]`` for ``weight2``.
    """
    kind = ExpertWeight(kind)
    ref = empty_like if empty_like is not None else next(iter(blocks.values()), torch.empty(0))
    empty = ref.new_empty(0)
    out: list[tuple[int, str, torch.Tensor]] = []
    for e in range(num_experts):
        w = blocks.get(e)
        if kind is ExpertWeight.WEIGHT1:
            if w is None:
                out += [(e, "gate_proj", empty), (e, "up_proj", empty)]
            else:
                out += [(e, "gate_proj", w[:, :ffn].t()), (e, "up_proj", w[:, ffn:].t())]
        else:
            out.append((e, "down_proj", empty if w is None else w.t()))
    return out


def expert_param_name(layer: int, expert: int, projection: str) -> str:
    """Hugging Face / vLLM name of one routed expert projection."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{projection}.weight"


def named_rollout_expert_tensors(
    layer: int, entries: list[tuple[int, str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` pairs for vLLM's ``load_weights`` from `rollout_expert_tensors` entries."""
    return [(expert_param_name(layer, e, proj), t) for e, proj, t in entries]
