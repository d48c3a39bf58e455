"""Every RNG a training rank draws from: Python, NumPy, torch (CPU), the accelerator and Megatron's tracker.

The accelerator's generator is reached through `verl_patches.device` (npu on A3, cuda, nothing on a CPU
host); Megatron's tensor-parallel tracker holds the per-TP/EP-rank streams used by dropout and init.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def _device_module() -> Any:
    from verl_patches.device import accelerator_module

    return accelerator_module()  # None on a CPU host


def _tracker() -> Any:
    try:
        from megatron.core import tensor_parallel
    except ImportError:
        return None
    return tensor_parallel.get_cuda_rng_tracker()


def _numpy_state() -> tuple:
    # plain types and a tensor only, so the file loads with torch.load(weights_only=True)
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))


def _set_numpy_state(state: tuple) -> None:
    name, keys, pos, has_gauss, gauss = state
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {"random": random.getstate(), "numpy": _numpy_state(),
                             "torch": torch.get_rng_state()}
    mod = _device_module()
    if mod is not None:
        state["device"] = mod.get_rng_state()
    tracker = _tracker()
    if tracker is not None:
        state["tracker"] = tracker.get_states()
    return state


def restore(state: dict[str, Any], where: str) -> None:
    """Set every RNG from ``state``; an entry this process needs but ``state`` lacks is an error naming ``where``."""
    for key in ("random", "numpy", "torch"):
        if key not in state:
            raise KeyError(f"{where}: RNG state {key!r} is missing")
    version, internal, gauss = state["random"]
    random.setstate((version, tuple(internal), gauss))
    _set_numpy_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    mod = _device_module()
    if mod is not None and "device" in state:
        mod.set_rng_state(state["device"])
    tracker = _tracker()
    if tracker is not None and tracker.get_states():
        if not state.get("tracker"):
            raise KeyError(f"{where}: Megatron's RNG tracker states are missing")
        tracker.set_states(state["tracker"])
