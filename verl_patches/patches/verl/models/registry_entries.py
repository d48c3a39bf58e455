"""Entries for DeepSeek-V3 in verl's model registries (G8, G9, G11).

verl keys its registries by the ``SupportedModel`` enum; the patch replaces the whole mapping by a copy whose
DeepSeek-V3 entry is ours, so the module-global lookups in ``verl.models.mcore.registry`` find it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from verl_patches.patching.declaration import lazy_object

DEEPSEEK_V3 = "DeepseekV3ForCausalLM"


def with_deepseek_v3(mapping: Mapping[Any, Any], value: Any) -> dict:
    keys = [k for k in mapping if getattr(k, "value", k) == DEEPSEEK_V3]
    if len(keys) != 1:
        raise KeyError(f"verl's registry has {len(keys)} entries for {DEEPSEEK_V3}, expected exactly one")
    out = dict(mapping)
    out[keys[0]] = value
    return out


def _wrapper(path: str) -> Callable[[Mapping[Any, Any]], dict]:
    def wrap(original: Mapping[Any, Any]) -> dict:
        return with_deepseek_v3(original, lazy_object(path)())

    return wrap


config_converters = _wrapper("verl_patches.patches.verl.models.config_converter:hf_to_mcore_config_dpskv3")
model_initializers = _wrapper("verl_patches.patches.verl.models.model_initializer:DeepseekV3Model")
forward_fns = _wrapper("verl_patches.patches.verl.models.model_forward:gptmodel_forward")
