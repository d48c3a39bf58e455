"""CPU host: vLLM inspects a lazily registered model class in this process, not in a fresh interpreter.

vllm-ascend registers its model classes by name (``"module:Class"``), and vLLM inspects such a class (its
interfaces: text generation, pipeline parallelism, ...) in a new interpreter (``python -m
vllm.model_executor.models.registry``) so that importing the model cannot initialise CUDA in the caller. On a
CPU host there is no CUDA to protect, and that interpreter only imports vLLM and vllm-ascend again: about 10 s of
CPU for every process that builds a rollout engine's config (four per tiny run, on a 2-core host). Here the same
``_ModelInfo.from_model_cls`` runs on the same class, in the process that asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def inspect_in_process(original: Callable[..., Any]) -> Callable[..., Any]:
    """WRAP of ``_LazyRegisteredModel.inspect_model_cls`` (a new body: the subprocess is not started)."""

    def inspect_model_cls(self: Any) -> Any:
        # deferred: a patch applies while upstream is still importing; vLLM is read at call time
        from vllm.model_executor.models.registry import _ModelInfo

        return _ModelInfo.from_model_cls(self.load_model_cls())

    inspect_model_cls.__doc__ = original.__doc__
    return inspect_model_cls
