"""``ActorRolloutRefWorker.save_checkpoint`` (Megatron) without the trailing ``torch.distributed.barrier()``.

Upstream ends the save with a barrier; the driver already waits for every worker's return (ONE_TO_ALL) and
then checks every rank's record before it commits, so the barrier adds nothing, and on a CPU host the
emulated ``npu`` device has no accelerator hooks for ``barrier()`` to ask about. Parameters offloaded to
the host are brought back for the save and offloaded again, as upstream.
"""

from __future__ import annotations

import functools
from typing import Any, Callable


def save_checkpoint(
    self: Any,
    checkpoint_path: str,
    hdfs_path: str | None = None,
    global_step: int = 0,
    max_ckpt_to_keep: int | None = None,
) -> None:
    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.megatron_utils import load_megatron_model_to_gpu, offload_megatron_model_to_cpu

    if self._is_offload_param:
        load_megatron_model_to_gpu(self.actor_module)
    self.checkpoint_mananager.save_checkpoint(
        local_path=checkpoint_path, hdfs_path=hdfs_path, global_step=global_step, max_ckpt_to_keep=max_ckpt_to_keep
    )
    if self._is_offload_param:
        offload_megatron_model_to_cpu(self.actor_module)


def keep_dispatch(original: Callable) -> Callable:
    """Our ``save_checkpoint`` under upstream's dispatch registration (the decorator's attributes are kept)."""
    return functools.wraps(original)(save_checkpoint)
