"""Importing this remaps CUDA calls onto the (emulated) NPU, i.e. the CPU: see verl_patches.npu_emulation.transfer."""

from verl_patches.npu_emulation.transfer import apply as _apply

_apply()
