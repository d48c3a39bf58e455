"""DeepSeek-V3's group-limited expert choice, with the unselected groups masked to -inf as DeepSeek's own
inference code masks them.

DeepSeek-V3 routes each token by sigmoid scores plus a per-expert score-correction bias (``noaux_tc``): the
experts fall into ``n_group`` groups, a group scores the sum of its two best biased scores, the ``topk_group``
best groups are kept, and the ``top_k`` best biased scores among their experts are chosen; the weights are
the unbiased scores of the chosen experts. DeepSeek's reference `Gate` (deepseek-ai/DeepSeek-V3,
inference/model.py) masks the experts of the groups it did not keep with ``-inf``: they can never be chosen.
It multiplied by a 0/1 mask (a 0.0 fill) until its commit "fix scores mask" (1398800, 2025-02-14), which
replaced that with ``masked_fill(..., float("-inf"))``: a biased score can be negative (sigmoid in (0, 1)
plus a negative bias), and below 0.0 a masked-out expert outranks it.

transformers 4.52.4's ``DeepseekV3TopkRouter.get_topk_indices`` still fills with 0.0, so with negative biased
scores HF picks experts from groups it did not select, while MindSpeed-LLM's training router
(``group_limited_topk``), the NPU kernel vllm-ascend calls (``npu_moe_gating_top_k``) and DeepSeek mask with
-inf. `topk_indices_with_masked_groups` is HF's method with DeepSeek's mask; nothing else of HF's router
changes (its group score is already the top-2 sum, its weights the unbiased scores).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch


def group_limited_top_k(
    choice: torch.Tensor, n_group: int, topk_group: int, top_k: int, group_by_top2: bool
) -> torch.Tensor:
    """Indices [tokens, top_k] of DeepSeek-V3's choice on ``choice`` [tokens, experts] (the scores used for
    choosing: biased when there is a bias): the ``topk_group`` best of ``n_group`` groups, each scored by the
    sum of its top 2 (``group_by_top2``, DeepSeek with a bias) or its max (without), the other groups' experts
    at -inf, then the ``top_k`` best experts."""
    tokens, experts = choice.shape
    if n_group > 1:
        grouped = choice.view(tokens, n_group, experts // n_group)
        score = grouped.topk(2, dim=-1).values.sum(dim=-1) if group_by_top2 else grouped.amax(dim=-1)
        kept = score.topk(topk_group, dim=-1).indices
        dropped = torch.ones_like(score, dtype=torch.bool).scatter(1, kept, False)
        choice = grouped.masked_fill(dropped.unsqueeze(-1), float("-inf")).view(tokens, experts)
    return choice.topk(top_k, dim=-1, sorted=False).indices


@torch.no_grad()
def topk_indices_with_masked_groups(self: Any, scores: torch.Tensor) -> torch.Tensor:
    """``DeepseekV3TopkRouter.get_topk_indices`` with the unselected groups at -inf (DeepSeek's Gate)."""
    choice = scores.view(-1, self.n_routed_experts) + self.e_score_correction_bias.unsqueeze(0)
    return group_limited_top_k(choice, self.n_group, self.topk_group, self.top_k, group_by_top2=True)


def hf_routes_as_deepseek() -> bool:
    """Whether transformers' DeepseekV3 router in this process masks unselected groups as DeepSeek does.

    Asked of the router's method itself on two groups of two experts whose biased scores are all negative:
    DeepSeek keeps group 0 and chooses its experts {0, 1}; a 0.0 fill chooses the masked-out {2, 3}."""
    # lazy: transformers is heavy and only this question needs it; importing this module stays light
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    router = SimpleNamespace(
        n_routed_experts=4, n_group=2, topk_group=1, top_k=2, e_score_correction_bias=torch.full((4,), -1.0)
    )
    chosen = DeepseekV3TopkRouter.get_topk_indices(router, torch.tensor([[0.9, 0.1, 0.5, 0.4]]))
    return sorted(chosen[0].tolist()) == [0, 1]
