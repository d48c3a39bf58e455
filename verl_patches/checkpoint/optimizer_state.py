"""Loading the distributed optimizer's DP-gathered parameter state without Megatron's bare ``torch.load``.

Megatron's ``DistributedOptimizer.load_parameter_state`` and ``ChainedOptimizer.load_parameter_state``
read the file with ``torch.load(filename)``, which on torch < 2.6 unpickles anything. This does what they
do (DP rank 0 of each optimizer reads the file, every rank takes part in the scatter of
``load_parameter_state_from_dp_zero``), with the file read by `safe_load.load_tensor_file`: weights only,
its sha256 checked against the step manifest before it is read. The scatter itself stays Megatron's (or
MindSpeed's replacement of it), so no upstream code is patched; the upstream methods mirrored here are
pinned by `MIRRORED` (a test compares their fingerprints with the Megatron tree).
"""

from __future__ import annotations

import os
from typing import Any

from verl_patches.checkpoint.safe_load import CheckpointFileError, load_tensor_file

# the upstream definitions this module mirrors -> their fingerprint (verl_patches.patching.fingerprint)
MIRRORED = {
    "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.load_parameter_state": "sha256:34bdddc8a49f61e1",
    "megatron.core.optimizer.optimizer:ChainedOptimizer.load_parameter_state": "sha256:553b8a70dc75dfad",
}


def _dp_rank(optimizer: Any) -> int:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    return torch.distributed.get_rank(optimizer.data_parallel_group)


def load_parameter_state(optimizer: Any, path: str | os.PathLike, expected_sha256: str) -> None:
    """Restore a (chained) distributed optimizer's parameter state from ``path``; a collective over DP."""
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is None:
        state = load_tensor_file(path, expected_sha256=expected_sha256) if _dp_rank(optimizer) == 0 else None
        if state is not None and not isinstance(state, dict):
            raise CheckpointFileError(
                f"{path}: expected the distributed optimizer's state dict, found {type(state).__name__}"
            )
        optimizer.load_parameter_state_from_dp_zero(state)
        return
    states = None
    for idx, inner in enumerate(chained):
        if not hasattr(inner, "load_parameter_state_from_dp_zero"):
            continue
        if _dp_rank(inner) == 0 and states is None:  # read once, by a rank that is DP rank 0 of some optimizer
            states = load_tensor_file(path, expected_sha256=expected_sha256)
            if not isinstance(states, list) or len(states) != len(chained):
                raise CheckpointFileError(
                    f"{path}: expected a list of {len(chained)} optimizer states, found "
                    f"{type(states).__name__}"
                    f"{f' of {len(states)}' if isinstance(states, list) else ''}"
                )
        inner.load_parameter_state_from_dp_zero(states[idx] if states else None)
