"""``FSDPCheckpointManager.load_checkpoint`` without unpickling (issue #27).

Upstream reads its three per-rank files with ``torch.load(..., weights_only=False)``. This replacement
reads them from the role folder of a committed step only, each through `safe_load.load_tensor_file`: its
sha256 checked against the step manifest first, then ``weights_only=True`` with the data-only classes a
sharded FSDP checkpoint holds allowed (DTensor and its mesh/placement records; NumPy's RNG state array).
What is done with the state is upstream's: the sharded state-dict context, model, optimizer, RNG and
learning-rate scheduler. The checkpoint resumed from is never deleted (``del_local_after_load`` is ignored,
as in the Megatron manager's replacement).
"""

from __future__ import annotations

import warnings
from typing import Any

from verl_patches.checkpoint.committed_role import CommittedRole
from verl_patches.checkpoint.safe_load import load_tensor_file


def fsdp_safe_globals() -> list[Any]:
    """Classes (and NumPy's array rebuild function) the weights-only loader may build for an FSDP checkpoint."""
    # lazy: numpy is heavy and only this path needs it; importing this module stays light
    import numpy as np

    # lazy: torch is heavy and only this path needs it; importing this module stays light
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    try:
        reconstruct = np._core.multiarray._reconstruct  # NumPy 2
    except AttributeError:
        reconstruct = np.core.multiarray._reconstruct
    return [
        DTensor,
        DTensorSpec,
        TensorMeta,
        DeviceMesh,
        Shard,
        Replicate,
        Partial,
        reconstruct,
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
    ]


def load_checkpoint(
    self: Any, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False
) -> None:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType

    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.device import is_cuda_available
    from verl.utils.fsdp_utils import get_fsdp_state_ctx

    if local_path is None:
        return
    committed = CommittedRole.open(local_path)
    allowed = fsdp_safe_globals()

    def read(kind: str) -> Any:
        path, sha = committed.path(f"{kind}_world_size_{self.world_size}_rank_{self.rank}.pt")
        return load_tensor_file(path, expected_sha256=sha, safe_globals=allowed)

    model_state, optim_state, extra_state = read("model"), read("optim"), read("extra_state")
    state_cfg = ShardedStateDictConfig(offload_to_cpu=bool(is_cuda_available))
    optim_cfg = ShardedOptimStateDictConfig(offload_to_cpu=bool(is_cuda_available))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with get_fsdp_state_ctx(self.model, StateDictType.SHARDED_STATE_DICT, state_cfg, optim_cfg):
            self.model.load_state_dict(model_state)
            if self.optimizer is not None:
                self.optimizer.load_state_dict(optim_state)
    if "rng" in extra_state:
        self.load_rng_state(extra_state["rng"])
    if self.lr_scheduler is not None:
        self.lr_scheduler.load_state_dict(extra_state["lr_scheduler"])
