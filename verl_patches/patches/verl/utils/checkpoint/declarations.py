"""Checkpoint and resume (issues #16, #27, 42): verl's Megatron checkpoint manager, the FSDP manager's load, the
trainer's save/load, and the fence that keeps an update from changing what a background save is still writing."""

from verl_patches.patches.upstream_fingerprints import pinned
from verl_patches.patching.declaration import ALL_DEVICES, replace, wrap

_M = "verl.utils.checkpoint.megatron_checkpoint_manager:MegatronCheckpointManager"
_T = "verl.trainer.ppo.ray_trainer:RayPPOTrainer"
_W = "verl.workers.megatron_workers:ActorRolloutRefWorker"
_F = "verl.utils.checkpoint.fsdp_checkpoint_manager:FSDPCheckpointManager"
_IMPL = "verl_patches.patches.verl.utils.checkpoint"

PATCHES = [
    replace(
        name="checkpoint.megatron_manager.save",
        target=f"{_M}.save_checkpoint",
        fingerprint="sha256:f66d6da7ea88abd9",
        by=f"{_IMPL}.megatron_manager:save_checkpoint",
        vendor_item="local",
        reason="per-(tp,pp,ep) model shards in the converter's layout (exportable to HF), distributed optimizer "
        "state with the EP index and its step count, every RNG, a per-rank record the driver checks",
        devices=ALL_DEVICES,
    ),
    replace(
        name="checkpoint.megatron_manager.load",
        target=f"{_M}.load_checkpoint",
        fingerprint="sha256:e62b33c707fd7bf1",
        by=f"{_IMPL}.megatron_manager:load_checkpoint",
        vendor_item="local",
        reason="resume model, optimizer and RNG state regardless of D1's no_load_optim/no_load_rng; a layout "
        "change other than DP is refused naming both layouts and the conversion",
        devices=ALL_DEVICES,
    ),
    replace(
        name="checkpoint.fsdp_manager.load",
        target=f"{_F}.load_checkpoint",
        fingerprint="sha256:aa4c499c9a9d0790",
        by=f"{_IMPL}.fsdp_manager:load_checkpoint",
        vendor_item="local",
        reason="upstream reads the per-rank files with torch.load(weights_only=False), which runs any pickled "
        "code; read them from a committed step only, each checked against its sha256 in the step manifest "
        "and loaded weights-only (issue #27)",
        devices=ALL_DEVICES,
    ),
    replace(
        name="checkpoint.trainer.save",
        target=f"{_T}._save_checkpoint",
        fingerprint=pinned(f"{_T}._save_checkpoint"),
        by=f"{_IMPL}.trainer:_save_checkpoint",
        vendor_item="local",
        reason="a step checkpoint appears by one rename once every rank's files are checked (a crash while "
        "saving leaves the previous one valid); keep-last pruning",
        devices=ALL_DEVICES,
    ),
    replace(
        name="checkpoint.trainer.load",
        target=f"{_T}._load_checkpoint",
        fingerprint=pinned(f"{_T}._load_checkpoint"),
        by=f"{_IMPL}.trainer:_load_checkpoint",
        vendor_item="local",
        reason="resume from the newest complete checkpoint (a stale tracker or an interrupted save is "
        "skipped) and say so in one line",
        devices=ALL_DEVICES,
    ),
    wrap(
        name="checkpoint.megatron_worker.save_without_barrier",
        target=f"{_W}.save_checkpoint",
        fingerprint=pinned(f"{_W}.save_checkpoint"),
        by=f"{_IMPL}.megatron_worker:keep_dispatch",
        # our save_checkpoint under upstream's registration: it never calls what it wraps, so it must be the
        # innermost layer (the catalog lists this module before megatron_declarations, whose progress wrap
        # then runs around it; declared after, it discarded that wrap)
        calls_original=False,
        vendor_item="local",
        reason="the trailing barrier is redundant (the driver waits for every worker and checks every rank's "
        "record) and fails on the CPU npu emulation; offloaded parameters are read from their host copies; "
        "background=True leaves the files to a thread (overlay.async_checkpoint)",
        devices=ALL_DEVICES,
    ),
    wrap(
        name="checkpoint.megatron_worker.fence_before_update",
        target=f"{_W}.update_actor",
        fingerprint=pinned(f"{_W}.update_actor"),
        by=f"{_IMPL}.background_save:fence_before_update",
        vendor_item="local",
        reason="a checkpoint written in the background reads host buffers the update changes (the swap optimizer's "
        "state, offloaded weights): the update waits for the write first, whoever calls it",
        devices=ALL_DEVICES,
    ),
]
