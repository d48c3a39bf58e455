"""vLLM's general plugins, loaded the moment `vllm` finishes importing.

vLLM loads its general plugins (group `vllm.general_plugins`) only when it builds an engine or a worker.
vllm-ascend's general plugin is where its torch 2.5.1 fix of `direct_register_custom_op` lives (torch
2.5.1's `infer_schema` refuses builtin generics such as `list[int]`), and where it registers its own
DeepSeek-V3 class. verl's driver imports vLLM's DeepSeek model (`verl.utils.vllm_utils`) long before any
engine exists, so on A3's torch 2.5.1 the import of vLLM's fp8 utilities raises ValueError there. Loading
the plugins right after `import vllm` (the first moment the package is whole, and before any model module
can be imported) gives every process the order an engine process has.
"""

from __future__ import annotations

from typing import Any


def registry_after_general_plugins(model_registry: Any) -> Any:
    """WRAP of `vllm:ModelRegistry`: load the general plugins, then hand out the same registry."""
    # deferred: a patch applies while upstream is still importing; vLLM is read at call time
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # idempotent: vLLM keeps a process-wide flag
    return model_registry
