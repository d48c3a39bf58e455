"""FSDP's module-state sync on the CPU.

FSDP1 with sync_module_states=True broadcasts rank 0's parameters to the other ranks, and first
refuses any CPU tensor because NCCL cannot broadcast them. gloo can, and on a CPU host every tensor is
a CPU tensor, so the refusal is the only thing in the way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def allow_cpu_module_states(module_states: list[torch.Tensor]) -> None:
    """Replacement for _check_module_states_for_sync_module_states on CPU hosts (gloo broadcasts CPU tensors)."""
    return None


def _with_field_off(base: type, field: str) -> type:
    """A dataclass under `base`'s name whose boolean `field` is always False, whatever the caller passes."""

    @dataclass
    class OnCpuHost(base):  # type: ignore[valid-type,misc]
        def __post_init__(self) -> None:
            setattr(self, field, False)

    OnCpuHost.__qualname__ = OnCpuHost.__name__ = base.__name__
    OnCpuHost.__module__ = __name__
    return OnCpuHost


def cpu_host_cpu_offload() -> type:
    """A CPUOffload whose parameter offloading is off: on a CPU host the parameters already live in
    host memory, and FSDP's offload path pins memory, which needs an accelerator."""
    # deferred: this runs while the patch on this very module applies; a module-level import would recurse
    from torch.distributed.fsdp.api import CPUOffload

    return _with_field_off(CPUOffload, "offload_params")


def cpu_host_cpu_offload_policy() -> type:
    """FSDP2's CPUOffloadPolicy with pin_memory off: pinning needs an accelerator, and on a CPU host
    the sharded parameters already live in (unpinned) host memory."""
    # deferred: this runs while the patch on this very module applies; a module-level import would recurse
    from torch.distributed._composable.fsdp._fsdp_api import CPUOffloadPolicy

    return _with_field_off(CPUOffloadPolicy, "pin_memory")
