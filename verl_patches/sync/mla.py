"""Rebuild vllm-ascend's MLA absorbed matrices after a weight load (vendor item E1, step 5).

vllm-ascend's MLA implementation (``vllm_ascend/attention/mla_v1.py``) derives ``W_UV`` and ``W_UK_T`` from
``kv_b_proj`` once, in ``process_weights_after_loading``. Loading new weights into ``kv_b_proj`` does not
touch them, so without this the rollout decodes with the previous step's attention weights and no error.
For every local decoder layer the derived matrices are dropped and rebuilt from the new ``kv_b_proj``.
"""
from __future__ import annotations

from typing import Any

import torch

DERIVED = ("W_UV", "W_UK_T", "w_kc", "w_vc")   # vllm-ascend 0.9.1 names, and older releases' names


def mla_impls(model: Any) -> list[Any]:
    """The MLA attention implementations of the model's local layers (missing PP layers skipped)."""
    inner = getattr(model, "model", model)
    out = []
    for layer in getattr(inner, "layers", ()):
        impl = getattr(getattr(getattr(layer, "self_attn", None), "mla_attn", None), "impl", None)
        if impl is not None and hasattr(impl, "process_weights_after_loading"):
            out.append(impl)
    return out


def rebuild_mla_absorbed(model: Any) -> int:
    """Recompute every layer's absorbed matrices from its current ``kv_b_proj``; returns the layer count."""
    impls = mla_impls(model)
    for impl in impls:
        for name in DERIVED:
            if hasattr(impl, name):
                setattr(impl, name, None)
        weight = getattr(getattr(impl, "kv_b_proj", None), "weight", None)
        impl.process_weights_after_loading(weight.dtype if isinstance(weight, torch.Tensor) else None)
    return len(impls)
