"""Every RNG a training rank draws from: Python, NumPy, torch (CPU), the accelerator, Megatron's tracker and
generators that components of the process own.

The accelerator's generator is reached through `verl_patches.device` (npu on A3, cuda, nothing on a CPU
host); Megatron's tensor-parallel tracker holds the per-TP/EP-rank streams used by dropout and init.
On A3, vLLM samples from the device's default generator, so the "device" entry carries the rollout's
sampling stream. The CPU rollout stand-in samples from a private generator instead; it registers it
(`register_generator`) so that a resumed run draws the same tokens as an uninterrupted one: the rollout
lives in the actor's process (the fused actor_rollout_ref worker), where the actor's checkpoint is written.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from verl_patches import device

# name -> generator; one entry per name (a newer owner replaces an older one: one rollout per process)
_GENERATORS: dict[str, torch.Generator] = {}


def register_generator(name: str, generator: torch.Generator) -> None:
    """Save and restore ``generator`` with this process's RNG states under ``name``."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"register_generator({name!r}): expected a torch.Generator, got {type(generator).__name__}")
    _GENERATORS[name] = generator


def unregister_generator(name: str, generator: torch.Generator | None = None) -> None:
    """Forget ``name`` (only if it is still ``generator``, when given)."""
    if generator is None or _GENERATORS.get(name) is generator:
        _GENERATORS.pop(name, None)


def registered_generators() -> dict[str, torch.Generator]:
    return dict(_GENERATORS)


def _device_module() -> Any:
    return device.accelerator_module()  # None on a CPU host


def _tracker() -> Any:
    try:
        # deferred: importing this module must not load Megatron; it loads once the prelude patched it
        from megatron.core import tensor_parallel
    except ImportError:
        return None
    return tensor_parallel.get_cuda_rng_tracker()


NumpyState = tuple[str, torch.Tensor, int, int, float]


def _numpy_state() -> NumpyState:
    # plain types and a tensor only, so the file loads with torch.load(weights_only=True)
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple)  # legacy=True: the MT19937 tuple (a dict only for other bit generators)
    name, keys, pos, has_gauss, gauss = legacy
    return (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))


def _set_numpy_state(state: NumpyState) -> None:
    name, keys, pos, has_gauss, gauss = state
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {"random": random.getstate(), "numpy": _numpy_state(), "torch": torch.get_rng_state()}
    mod = _device_module()
    if mod is not None:
        state["device"] = mod.get_rng_state()
    tracker = _tracker()
    if tracker is not None:
        state["tracker"] = tracker.get_states()
    if _GENERATORS:
        state["generators"] = {name: g.get_state() for name, g in _GENERATORS.items()}
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
    saved = state.get("generators") or {}
    for name, generator in _GENERATORS.items():
        # a generator this process samples from but the checkpoint lacks: the draws after the resume
        # would silently differ from the run that wrote it
        if name not in saved:
            raise KeyError(f"{where}: RNG state of generator {name!r} is missing")
        generator.set_state(saved[name])
