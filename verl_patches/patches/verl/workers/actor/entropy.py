"""C6: verl's tensor-parallel entropy without ``@torch.compile``.

Upstream compiles the inner ``(softmax * logits).sum(-1)`` with ``torch.compile(dynamic=True)``, which does
not compile on NPU, and MindSpeed replaces ``torch.compile`` by ``torch.jit.script`` process-wide, which
cannot script a closure. The arithmetic is the same as upstream's, in plain torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class VocabParallelEntropy(torch.autograd.Function):
    """Entropy of softmax(logits) over a vocabulary split across the tensor-parallel group."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits: torch.Tensor) -> torch.Tensor:
        # deferred: a patch applies while upstream is still importing; Megatron is read at call time
        from megatron.core import parallel_state as mpu

        group = mpu.get_tensor_model_parallel_group()
        logits_max = vocab_parallel_logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        exp_logits = (vocab_parallel_logits - logits_max).exp_()
        sum_exp = exp_logits.sum(dim=-1, keepdim=True)
        dist.all_reduce(sum_exp, group=group)
        softmax = exp_logits.div_(sum_exp)
        sum_softmax_times_logits = (softmax * vocab_parallel_logits).sum(dim=-1, keepdim=True)
        dist.all_reduce(sum_softmax_times_logits, group=group)
        entropy = logits_max + sum_exp.log() - sum_softmax_times_logits
        ctx.save_for_backward(vocab_parallel_logits, softmax, sum_softmax_times_logits)
        return entropy.squeeze(dim=-1)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        logits, softmax, sum_softmax_times_logits = ctx.saved_tensors
        # dH/dz_i = -p_i (z_i - sum_j p_j z_j)
        return -softmax * (logits - sum_softmax_times_logits) * grad_output.unsqueeze(-1)
