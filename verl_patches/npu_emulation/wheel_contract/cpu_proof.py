"""The CPU proof's declared exceptions to the kernels' documented limits: the only ways an input the real torch_npu
kernel refuses is accepted here, each a named deviation from A3 that the audit lists.

* `FP32_RUN`: the tiny run computes in float32 so that rollout and training log-probs agree (declared patch
  ``vllm.engine.arg_utils.v1_oracle.fp32_on_cpu``); the attention, cache and ring-MLA kernels document bf16/fp16
  only. While in effect, float32 is accepted where the documented list has bf16 or fp16; any other dtype outside
  the list is still refused.
* `SCALED_MODEL`: the CPU proof's DeepSeek-V3 is scaled down (a few heads of a few dimensions), below sizes the
  kernels document for MLA (FIA with rope: 32/64/128 query heads per rank, latent 512, rope 64; ring MLA: 128 and
  64 per head; 32-byte-aligned cache rows). While in effect those size limits are not enforced; every other
  limit is.

Both are switches in the environment, so the processes a rollout worker starts see them too; the fp32 patch sets
both when it lets a float32 engine through (the CPU proof's run of its scaled-down model), a bf16 run of the same
model on a CPU host sets only `SCALED_MODEL` (`declare`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from verl_patches.base import env_registry


@dataclass(frozen=True)
class CpuProofException:
    name: str
    env: str  # the switch
    deviation: str  # what A3 would refuse that is accepted while it is in effect (the audit's line)
    owner: str  # who switches it on


FP32_RUN = CpuProofException(
    name="fp32 run",
    env="VERL_PATCHES_CPU_PROOF_FP32",
    deviation="fp32 accepted where the real kernel requires bf16/fp16: the CPU proof's fp32 run",
    owner="verl_patches/patches/vllm/engine/fp32_on_cpu.py (when it lets a float32 V1 engine through on a CPU host)",
)
SCALED_MODEL = CpuProofException(
    name="scaled-down model",
    env="VERL_PATCHES_CPU_PROOF_SCALED_MODEL",
    deviation="model sizes below the kernels' documented MLA sizes accepted (query heads per rank, latent and rope "
    "head sizes, cache row alignment): the CPU proof's scaled-down DeepSeek-V3",
    owner="verl_patches/patches/vllm/engine/fp32_on_cpu.py (with the fp32 run); a bf16 CPU run sets it itself",
)
EXCEPTIONS = (FP32_RUN, SCALED_MODEL)


def in_effect(exception: CpuProofException) -> bool:
    return env_registry.flag(exception.env)


def declare(exception: CpuProofException) -> None:
    """Switch ``exception`` on for this process and the processes it starts."""
    os.environ[exception.env] = "1"
