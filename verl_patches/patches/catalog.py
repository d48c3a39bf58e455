"""The ordered list of patch declaration modules. Order here is application order.

Patches on one upstream target apply in this order (they share its module, so they apply in one step), each
WRAP around what the one before left: the last declared is the outermost layer. `python -m verl_patches.audit`
prints each such stack, and tests/patching/test_patch_stacks.py pins them.
"""

from __future__ import annotations

import importlib

from verl_patches.patching.declaration import Patch

DECLARATION_MODULES = (
    "verl_patches.patches.flash_attn.declarations",
    "verl_patches.patches.apex.declarations",
    "verl_patches.patches.torch.declarations",
    "verl_patches.patches.transformers.declarations",
    "verl_patches.patches.verl.utils.declarations",
    "verl_patches.patches.verl.single_controller.declarations",
    "verl_patches.patches.verl.workers.declarations",
    "verl_patches.patches.verl.trainer.declarations",
    "verl_patches.patches.vllm.declarations",
    "verl_patches.patches.vllm.model_executor.models.declarations",
    "verl_patches.patches.vllm.engine.declarations",
    "verl_patches.patches.vllm.v1.core.declarations",
    "verl_patches.patches.vllm.v1.engine.declarations",
    "verl_patches.patches.vllm.v1.sample.declarations",
    "verl_patches.patches.vllm_ascend.declarations",
    "verl_patches.patches.verl.workers.rollout.declarations",
    "verl_patches.patches.verl.models.declarations",
    "verl_patches.patches.verl.declarations",
    # before megatron_declarations: its save_checkpoint is a new body (calls_original=False), which must be the
    # innermost layer of that method's stack, beneath the progress wrap
    "verl_patches.patches.verl.utils.checkpoint.declarations",
    "verl_patches.patches.verl.workers.megatron_declarations",
    "verl_patches.patches.megatron.declarations",
    "verl_patches.patches.mindspeed.declarations",
    "verl_patches.patches.verl.models.mcore.weight_converter_declarations",
    "verl_patches.patches.verl.utils.sync_declarations",
    "verl_patches.patches.verl.workers.sharding_manager.declarations",
)


def all_patches() -> list[Patch]:
    patches: list[Patch] = []
    for name in DECLARATION_MODULES:
        patches.extend(importlib.import_module(name).PATCHES)
    return patches
