"""MindSpeed's op builders on a CPU host: `load()` hands out the plain-torch emulations instead of
JIT-compiling C++ against CANN (see verl_patches.npu_emulation.builder_ops)."""

from __future__ import annotations

from typing import Any

from verl_patches.npu_emulation import builder_ops  # read at call time: the engine test counts the calls


def emulated_load(self: Any, verbose: bool = True) -> Any:
    return builder_ops.emulated_ops(self.name)


def gmm_common_on_host(
    original_weight, x, weight, *, bias=None, group_list=None, group_type=0, group_list_type=0, gemm_fusion=False
):
    """mindspeed.ops.gmm._npu_gmm_common without the torch.library dispatch: MindSpeed registers its
    GMM ops for the PrivateUse1 (NPU) key only, so CPU tensors call those same Python implementations
    directly (same checks, same autograd Function)."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    # deferred: a patch applies while upstream is still importing; MindSpeed is read at call time
    from mindspeed.ops import gmm

    if weight.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"Only support non quant case, but got weight dtype {weight.dtype}.")
    gmm.npu_gmm_param_verification(
        x, weight, bias=bias, group_list=group_list, group_type=group_type, group_list_type=group_list_type
    )
    if group_list_type == 0:
        return gmm._npu_gmm(
            original_weight, x, weight, bias=bias, group_list=group_list, group_type=group_type, gemm_fusion=gemm_fusion
        )
    if group_list_type == 1:
        return gmm._npu_gmm_v2(
            original_weight, x, weight, bias=bias, group_list=group_list, group_type=group_type, gemm_fusion=gemm_fusion
        )
    raise ValueError(f"group_list_type must be 0 or 1, but got {group_list_type}.")
