"""CPU emulation of torch_npu (verl_patches). Not the Ascend extension: see verl_patches.npu_emulation.

Importing it registers the "npu" device name and the `torch.npu` module (devices map to the CPU) and
exposes the emulated fused operations under their torch_npu names. Additive by design: new
namespaces are new submodules; new ops go in verl_patches/npu_emulation/ops and the list below.
"""

from torch_npu import _C, _device  # noqa: F401
from torch_npu import npu  # noqa: F401  (the torch.npu module)
from torch_npu import _hccl_backend  # noqa: F401  (an `hccl` backend carried by gloo, for vllm-ascend)
from torch_npu import _hccl_comm_name

from verl_patches.npu_emulation.ops.activation import npu_swiglu, npu_swiglu_backward  # noqa: F401
from verl_patches.npu_emulation.ops.attention import npu_fusion_attention, npu_fusion_attention_grad  # noqa: F401
from verl_patches.npu_emulation.ops.norm import npu_rms_norm  # noqa: F401
from verl_patches.npu_emulation.ops.optim import npu_apply_adam_w  # noqa: F401
from verl_patches.npu_emulation.ops.rotary import npu_rotary_mul  # noqa: F401
from verl_patches.npu_emulation.ops.softmax import npu_scaled_masked_softmax  # noqa: F401

__version__ = "2.5.1.post1+cpu.emulation"
VERL_PATCHES_CPU_EMULATION = True  # how our code tells this package from the real torch_npu

_device.register()
_hccl_comm_name.register()  # the MC2 ops find the EP group by the name vllm-ascend reads

# torch.library custom ops (torch.ops.npu / atb / npu_inference) for vllm-ascend's inference path
from torch_npu.op_plugin.atb import _atb_ops  # noqa: E402
from verl_patches.npu_emulation.ops.inference_registry import register_inference_ops  # noqa: E402

_inference_ops = register_inference_ops()
globals().update(_inference_ops.torch_npu)
atb = _atb_ops.add_atb_module(_inference_ops.atb)

# MoE inference ops (gating, routing, list-form grouped matmul, MC2 dispatch/combine) as torch.ops.npu custom ops
from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops  # noqa: E402

globals().update(register_moe_ops())
