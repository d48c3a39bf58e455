"""``ActorRolloutRefWorker.save_checkpoint`` (Megatron) without the trailing ``torch.distributed.barrier()``,
and with the option of writing the files in the background (issue 42).

Upstream ends the save with a barrier; the driver already waits for every worker's return (ONE_TO_ALL) and
then checks every rank's record before it commits, so the barrier adds nothing, and on a CPU host the
emulated ``npu`` device has no accelerator hooks for ``barrier()`` to ask about.

Parameters offloaded to the host are read where verl keeps them (the DDP buffers' host copies,
`actor_state.model_state`), with no round trip through the device; upstream's load-save-offload is kept only
when the distributed optimizer's main parameters are views of the model's own parameter buffer (fp32
parameters: there is no separate fp32 copy), which offloading frees. Where those parameters are host tensors
(a CPU host: the tiny run), a background save's snapshot copies them first (`ActorSnapshot.owned`).

``background=True`` (the driver's choice, `trainer_io.background_saves`): the snapshot is taken here, the
files are written by a thread while the next step runs, and `driver.checkpoint_fence.fence_in_worker` waits for them.
A pending write of an earlier save is waited for first, whatever the mode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.driver.checkpoint_fence import fence_in_worker


def optimizer_reads_model_params(optimizer: Any) -> bool:
    """Whether a (chained) distributed optimizer keeps main parameters that are views of the model's parameters
    (its fp32 groups), so that its state cannot be read while they are offloaded."""
    for inner in getattr(optimizer, "chained_optimizers", None) or ([optimizer] if optimizer is not None else []):
        if any(len(group) for group in getattr(inner, "shard_fp32_groups", None) or []):
            return True
        if not hasattr(inner, "shard_fp32_groups") and hasattr(inner, "optimizer"):
            return True  # not a distributed optimizer: its state holds the parameters themselves
    return False


def save_checkpoint(
    self: Any,
    checkpoint_path: str,
    hdfs_path: str | None = None,
    global_step: int = 0,
    max_ckpt_to_keep: int | None = None,
    background: bool = False,
) -> None:
    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.megatron_utils import load_megatron_model_to_gpu, offload_megatron_model_to_cpu

    fence_in_worker(self)  # the previous save's write must be done before this one reads the state again
    onload = bool(self._is_offload_param) and optimizer_reads_model_params(self.actor_optimizer)
    if onload:
        load_megatron_model_to_gpu(self.actor_module)
    self.checkpoint_mananager.save_checkpoint(
        local_path=checkpoint_path,
        hdfs_path=hdfs_path,
        global_step=global_step,
        max_ckpt_to_keep=max_ckpt_to_keep,
        background=background,
        # parameters that are host tensors themselves (a CPU host) are kept as they are by the snapshot, and the
        # offload below frees them: a background write must own a copy
        own_copy=background and onload and _params_device(self.actor_module) == "cpu",
    )
    if onload:
        offload_megatron_model_to_cpu(self.actor_module)


def _params_device(modules: Any) -> str:
    for module in modules:
        for param in module.parameters():
            return param.device.type
    return ""


def keep_dispatch(original: Callable) -> Callable:
    """Our ``save_checkpoint`` under upstream's dispatch registration (the decorator's attributes are kept)."""
    return functools.wraps(original)(save_checkpoint)
