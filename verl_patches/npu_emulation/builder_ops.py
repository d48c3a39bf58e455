"""What each MindSpeed op builder's `load()` returns on a CPU host: a namespace of the plain-torch ops.

MindSpeed JIT-compiles each builder's C++ against CANN/ATB; on a CPU host the declared patch of
`MindSpeedOpBuilder.load` (verl_patches.patches.mindspeed) returns these instead. A builder not listed
here fails with an error naming it, so an op the profile starts to use cannot run unemulated.
"""

from __future__ import annotations

import importlib
import types

OPS = "verl_patches.npu_emulation.ops"
# builder OP_NAME -> {attribute: "module:function"}
BUILDER_OPS: dict[str, dict[str, str]] = {
    "grouped_matmul": {
        "npu_gmm": f"{OPS}.gmm:npu_gmm",
        "npu_gmm_backward": f"{OPS}.gmm:npu_gmm_backward",
        "npu_gmm_backward_fusion": f"{OPS}.gmm:npu_gmm_backward_fusion",
    },
    "grouped_matmul_v2": {
        "npu_gmm": f"{OPS}.gmm:npu_gmm",
        "npu_gmm_backward": f"{OPS}.gmm:npu_gmm_backward",
        "npu_gmm_backward_fusion": f"{OPS}.gmm:npu_gmm_backward_fusion",
    },
    "npu_groupmatmul_add_fp32": {"npu_groupmatmul_add_fp32": f"{OPS}.gmm:npu_groupmatmul_add_fp32"},
    "npu_matmul_add_fp32": {"npu_matmul_add_fp32": f"{OPS}.gmm:npu_matmul_add_fp32"},
    "npu_moe_token_permute": {"npu_moe_token_permute": f"{OPS}.moe:npu_moe_token_permute"},
    "npu_moe_token_unpermute": {"npu_moe_token_unpermute": f"{OPS}.moe:npu_moe_token_unpermute"},
    "npu_rotary_position_embedding": {"npu_rotary_position_embedding": f"{OPS}.rotary:npu_rotary_position_embedding"},
    "npu_apply_fused_adamw_v2": {"npu_apply_fused_adamw_v2": f"{OPS}.optim:npu_apply_fused_adamw_v2"},
    "fusion_attention_v2": {
        "npu_fusion_attention_v2": f"{OPS}.attention:npu_fusion_attention_v2",
        "npu_fusion_attention_grad_v2": f"{OPS}.attention:npu_fusion_attention_grad_v2",
    },
}


class UnemulatedBuilderError(RuntimeError):
    pass


def _resolve(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def emulated_ops(builder_name: str) -> types.SimpleNamespace:
    """The namespace `load()` returns for the builder named `builder_name`."""
    table = BUILDER_OPS.get(builder_name)
    if table is None:
        raise UnemulatedBuilderError(
            f"MindSpeed op builder {builder_name!r} has no CPU emulation (it needs CANN and an NPU); emulated: "
            f"{sorted(BUILDER_OPS)}"
        )
    return types.SimpleNamespace(**{attr: _resolve(path) for attr, path in table.items()})
