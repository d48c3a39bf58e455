"""vllm-ascend's eager grouped top-k (`select_experts` with ``use_grouped_topk``) as DeepSeek-V3 routes.

vllm-ascend 0.9.1 calls the fused kernel ``npu_moe_gating_top_k`` only for a model of exactly 256 routed
experts; any other count (a truncated checkpoint, a smaller DeepSeek-shaped model) takes `select_experts`,
whose `native_grouped_topk` differs from DeepSeek-V3's Gate, from the kernel and from MindSpeed-LLM's
training router twice: it scores a group by its best expert where DeepSeek (with a score-correction bias)
sums the best two, and it fills the unselected groups with 0.0 where DeepSeek masks them with -inf (a
negative biased score then loses to an expert of a group that was not selected). The wrap routes the grouped
case by DeepSeek's rule (`deepseek_v3_router.group_limited_top_k`, the transformers patch's) and leaves every
other case, and the weights' arithmetic (unbiased scores, renormalised without eps), as upstream has them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from verl_patches.patches.transformers.deepseek_v3_router import group_limited_top_k


def grouped_as_deepseek(original: Callable[..., Any]) -> Callable[..., Any]:
    """`select_experts` whose grouped branch chooses as DeepSeek-V3's Gate (WRAP patch factory)."""

    @functools.wraps(original)
    def select_experts(
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        top_k: int,
        use_grouped_topk: bool,
        renormalize: bool,
        topk_group: int | None = None,
        num_expert_group: int | None = None,
        custom_routing_function: Callable[..., Any] | None = None,
        scoring_func: str = "softmax",
        e_score_correction_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        grouped = (
            use_grouped_topk
            and custom_routing_function is None
            and topk_group is not None
            and num_expert_group is not None
            and scoring_func in ("softmax", "sigmoid")
        )
        if not grouped:
            return original(
                hidden_states,
                router_logits,
                top_k,
                use_grouped_topk,
                renormalize,
                topk_group=topk_group,
                num_expert_group=num_expert_group,
                custom_routing_function=custom_routing_function,
                scoring_func=scoring_func,
                e_score_correction_bias=e_score_correction_bias,
            )
        scores = router_logits.softmax(dim=-1) if scoring_func == "softmax" else router_logits.sigmoid()
        biased = e_score_correction_bias is not None
        choice = scores + e_score_correction_bias.unsqueeze(0) if biased else scores
        # float32 as upstream chooses (bf16 top-k is unsupported in a TorchAir graph)
        ids = group_limited_top_k(choice.float(), num_expert_group, topk_group, top_k, group_by_top2=biased)
        weights = scores.gather(1, ids) if biased else scores.float().gather(1, ids)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids.to(torch.int32)

    return select_experts
