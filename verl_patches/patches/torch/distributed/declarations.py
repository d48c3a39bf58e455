"""Patches of torch.distributed: the collective hang watchdog (verl_patches/resilience)."""

from verl_patches.patching.declaration import ALL_DEVICES, Kind, Patch, lazy_call
from verl_patches.resilience.collective_watchdog import WATCHED_COLLECTIVES

PATCHES = [
    Patch(
        name=f"resilience.torch.distributed.{op}.watchdog",
        target=f"torch.distributed.distributed_c10d:{op}",
        kind=Kind.WRAP,
        # a signature-preserving wrapper that never depends on the body: the same on torch 2.5.1 (A3) and 2.13 (CPU)
        fingerprint="",
        replacement=lazy_call("verl_patches.resilience.collective_watchdog:watch_collective"),
        vendor_item="local",
        reason="a peer that never joins a collective (a stuck HCCL rank) is reported within "
               "VERL_PATCHES_COLLECTIVE_TIMEOUT_S naming the rank, the collective and the step, instead of a silent "
               "hang; a pass-through while that variable is unset",
        devices=ALL_DEVICES,
    )
    for op in WATCHED_COLLECTIVES
]
