"""The ordered list of patch declaration modules. Order here is application order."""

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
    "verl_patches.patches.vllm.v1.engine.declarations",
    "verl_patches.patches.vllm.v1.sample.declarations",
    "verl_patches.patches.vllm_ascend.declarations",
    "verl_patches.patches.verl.workers.rollout.declarations",
    "verl_patches.patches.verl.models.declarations",
    "verl_patches.patches.verl.declarations",
    "verl_patches.patches.verl.workers.megatron_declarations",
    "verl_patches.patches.megatron.declarations",
    "verl_patches.patches.mindspeed.declarations",
    "verl_patches.patches.verl.models.mcore.weight_converter_declarations",
    "verl_patches.patches.verl.utils.sync_declarations",
    "verl_patches.patches.verl.workers.sharding_manager.declarations",
    "verl_patches.patches.verl.utils.checkpoint.declarations",
)


def all_patches() -> list[Patch]:
    patches: list[Patch] = []
    for name in DECLARATION_MODULES:
        patches.extend(importlib.import_module(name).PATCHES)
    return patches
