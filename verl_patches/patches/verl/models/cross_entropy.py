"""G6/G7: the vocabulary-parallel cross entropy (verl's log-probs) without a full fp32 copy of the logits.

core_r0.8.0's ``calculate_logits_max`` returns ``logits.float()``: for bf16 logits a full fp32 copy, and
MindSpeed's ``calculate_predicted_logits`` then subtracts the max out of place, a second full fp32 tensor.
On the last pipeline stage that is ``2 * tokens * vocab / TP * 4`` bytes (the preflight counts both).

G6 (the vendor's intent, done right): the max is taken on the logits in their own dtype, which is exact
(the max of bf16 values is one of them), and returned in fp32; the logits are returned as they are.
G7: the subtraction ``logits - max`` with the fp32 max promotes to one fp32 tensor, on which ``exp`` runs in
place, so everything after the max is computed in fp32 exactly as upstream (same values, one copy fewer).
The vendor's in-place ``logits -= max`` on bf16 logits would round every shifted logit to bf16; this never
writes into the logits. MindSpeed registers its own ``calculate_predicted_logits`` (also out of place) at
initialisation; either one pairs correctly with G6.
"""

from __future__ import annotations

import torch


def calculate_logits_max(vocab_parallel_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return vocab_parallel_logits, torch.max(vocab_parallel_logits, dim=-1)[0].float()


def calculate_predicted_logits(
    vocab_parallel_logits: torch.Tensor,
    target: torch.Tensor,
    logits_max: torch.Tensor,
    vocab_start_index: int,
    vocab_end_index: int,
) -> tuple:
    shifted = vocab_parallel_logits - logits_max.float().unsqueeze(-1)  # the one fp32 working tensor
    target_mask = (target < vocab_start_index) | (target >= vocab_end_index)
    masked_target_1d = ((target - vocab_start_index) * ~target_mask).view(-1)
    logits_2d = shifted.view(-1, shifted.size(-1))
    rows = torch.arange(logits_2d.size(0), device=logits_2d.device)
    predicted_logits = logits_2d[rows, masked_target_1d].clone().view_as(target) * ~target_mask
    exp_logits = shifted.exp_()
    return target_mask, masked_target_1d, predicted_logits, exp_logits.sum(dim=-1), exp_logits


def logits_max_staticmethod() -> staticmethod:
    return staticmethod(calculate_logits_max)


def predicted_logits_staticmethod() -> staticmethod:
    return staticmethod(calculate_predicted_logits)
