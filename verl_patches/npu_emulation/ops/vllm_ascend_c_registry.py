"""vllm-ascend's compiled kernels as `torch.ops._C` dispatcher ops on a CPU host, with the binding's own schemas.

On A3, `import vllm_ascend.vllm_ascend_C` (the extension built from the pinned sdist, verl_patches/rollout/kernels.py)
defines them in the `_C` library. A CPU host has no such build; this module defines the same ops, with the schemas
csrc/torch_binding.cpp writes, over the plain-torch kernels of `vllm_ascend_kernels` (every device: CPU tensors and
the emulated npu tensors alike), plus fakes for tracing. It never runs where the extension exists: the registration
is refused when `vllm_ascend/vllm_ascend_C*` can be found on vllm-ascend's package path, since the extension's own
`TORCH_LIBRARY(_C)` would then define the same names. `enable_custom_op()` is untouched (False on a CPU host), so
vllm-ascend keeps the branch it takes without the extension; only callers that use the ops directly (vllm-ascend's
own kernel tests) reach them.

`register_vllm_ascend_c_ops()` is called by the stand-in torch_npu package (which exists only on a CPU host); a
second call finds the ops and does nothing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from verl_patches.npu_emulation.ops import vllm_ascend_kernels

NAMESPACE = "_C"
EXTENSION = "vllm_ascend_C"

# name -> (schema as csrc/torch_binding.cpp defines it at the pin, kernel, fake)
_Entry = tuple[str, Callable[..., Any], Callable[..., Any]]


def _rotary_fake(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int, *a: Any) -> tuple:
    tokens = positions.numel()
    return (
        query.new_empty(tokens, query.numel() // max(tokens, 1) // head_size, head_size),
        key.new_empty(tokens, key.numel() // max(tokens, 1) // head_size, head_size),
    )


def _masked_fake(input: torch.Tensor, *a: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), torch.empty_like(input, dtype=torch.bool)


def _nothing(*a: Any) -> None:
    return None


OPS: dict[str, _Entry] = {
    "rotary_embedding": (
        "rotary_embedding(Tensor positions, Tensor! query, Tensor! key, int head_size, Tensor cos_sin_cache, "
        "bool is_neox) -> (Tensor query, Tensor key)",
        vllm_ascend_kernels.rotary_embedding,
        _rotary_fake,
    ),
    "get_masked_input_and_mask": (
        "get_masked_input_and_mask(Tensor input, int org_vocab_start_index, int org_vocab_end_index, "
        "int num_org_vocab_padding, int added_vocab_start_index, int added_vocab_end_index) "
        "-> (Tensor masked_input, Tensor mask)",
        vllm_ascend_kernels.get_masked_input_and_mask,
        _masked_fake,
    ),
    "advance_step_flashattn_ascendc": (
        "advance_step_flashattn_ascendc(int num_seqs, int num_queries, int block_size, Tensor! input_tokens, "
        "Tensor! sampled_token_ids, Tensor! input_positions, Tensor! seq_lens, Tensor! slot_mapping, "
        "Tensor! block_tables) -> ()",
        vllm_ascend_kernels.advance_step_flashattn_ascendc,
        _nothing,
    ),
}

_LIBRARY: list[torch.library.Library] = []  # keeps the registrations alive for the process


class CompiledKernelsPresent(RuntimeError):
    """vllm-ascend's compiled extension is installed: its ops are the real ones, never emulated."""


def compiled_extension_location() -> str | None:
    """Where `vllm_ascend.vllm_ascend_C` would load from, found without importing vllm_ascend (None: absent)."""
    package = importlib.util.find_spec("vllm_ascend")
    if package is None or not package.submodule_search_locations:
        return None
    spec = importlib.machinery.PathFinder.find_spec(EXTENSION, list(package.submodule_search_locations))
    return None if spec is None else str(spec.origin)


def _defined(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
    except AttributeError:
        return False
    return True


def register_vllm_ascend_c_ops() -> dict[str, Any]:
    """Define every op of OPS under torch.ops._C (once per process); return {name: op packet}."""
    missing = [name for name in OPS if not _defined(name)]
    if missing:
        found = compiled_extension_location()
        if found is not None:
            raise CompiledKernelsPresent(
                f"vllm-ascend's compiled kernels are installed ({found}): torch.ops._C.{missing[0]} comes from them, "
                "and the CPU emulation of it must not be registered"
            )
        if not _LIBRARY:
            _LIBRARY.append(torch.library.Library(NAMESPACE, "FRAGMENT"))
        lib = _LIBRARY[0]
        for name in missing:
            schema, kernel, fake = OPS[name]
            lib.define(schema)
            lib.impl(name, kernel, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    return {name: getattr(getattr(torch.ops, NAMESPACE), name) for name in OPS}
