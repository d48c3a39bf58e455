"""CPU emulation of torch_npu (verl_patches). Not the Ascend extension: see verl_patches.npu_emulation.

Importing it registers the "npu" device name and the `torch.npu` module (devices map to the CPU) and
exposes the emulated operations under the names the pinned torch_npu wheel exposes them by: the inference ops
as dispatcher ops with the wheel's schemas and Meta functions, the training ops as Python functions with the
wheel's signatures (verl_patches/npu_emulation/wheel_contract). New ops go in verl_patches/npu_emulation/ops and
their registry; this package adds no name the wheel's torch_npu lacks (tests/npu_emulation/test_wheel_contract.py).
"""

# the submodules load in this order, as the package's start-up expects
# isort: off
from torch_npu import _C, _device  # noqa: F401
from torch_npu import npu  # noqa: F401  (the torch.npu module)
from torch_npu import _hccl_backend  # noqa: F401  (an `hccl` backend carried by gloo, for vllm-ascend)
from torch_npu import _hccl_comm_name

# isort: on

__version__ = "2.5.1.post1+cpu.emulation"
VERL_PATCHES_CPU_EMULATION = True  # how our code tells this package from the real torch_npu

_device.register()
_hccl_comm_name.register()  # the MC2 ops find the EP group by the name vllm-ascend reads


def _expose_emulated_ops() -> None:
    # deferred: the registries load the wheel's contract and torch.library; run once, right below
    from torch_npu.op_plugin.atb import _atb_ops
    from verl_patches.npu_emulation.ops.inference_registry import register_inference_ops
    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops
    from verl_patches.npu_emulation.ops.training_registry import training_functions
    from verl_patches.npu_emulation.ops.vllm_ascend_c_registry import register_vllm_ascend_c_ops

    names = globals()
    names.update(training_functions())
    packets = register_inference_ops().packets
    names.update({name: op for name, op in packets.items() if not name.startswith("atb.")})
    names["atb"] = _atb_ops.add_atb_module(
        {n.split(".", 1)[1]: op for n, op in packets.items() if n.startswith("atb.")}
    )
    names.update(register_moe_ops())
    register_vllm_ascend_c_ops()  # torch.ops._C: vllm-ascend's own compiled kernels, which a CPU host lacks


_expose_emulated_ops()
del _expose_emulated_ops
