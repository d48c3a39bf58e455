"""The A3 rollout engine on a CPU host: vllm-ascend's engine on the emulated npu device (a CPU-only patch).

On a CPU host the torch_npu emulation remaps cuda and npu devices to the CPU process-wide, for Megatron and
MindSpeed, which the CPU proof runs on CPU tensors. vllm-ascend's engine, colocated in the same worker process,
runs on npu tensors: its model runner's ``torch.zeros(..., device="npu:0")`` must give an npu tensor beside the npu
weights. So the engine's entry points (build, generate, sleep, wake-up) run inside the emulation's
`native_devices` scope. On A3 nothing is remapped: the engine is bound as it is
(`verl_patches.rollout.engine_factory.build_llm`), and this module is never imported.
"""

from __future__ import annotations

from typing import Any

from verl_patches.npu_emulation.transfer import native_devices
from verl_patches.rollout import engine_factory

_CLASS: type | None = None


def emulated_npu_llm_class() -> type:
    """`engine_factory.overlay_llm_class` with every entry point inside `native_devices` (created once)."""
    global _CLASS
    if _CLASS is None:
        base: Any = engine_factory.overlay_llm_class()

        class EmulatedNpuLLM(base):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                with native_devices():
                    super().__init__(*args, **kwargs)

            def generate(self, *args: Any, **kwargs: Any) -> Any:
                with native_devices():
                    return super().generate(*args, **kwargs)

            def sleep(self, level: int = 1) -> None:
                with native_devices():
                    super().sleep(level)

            def wake_up(self, tags: list[str] | None = None) -> None:
                with native_devices():
                    super().wake_up(tags)

        _CLASS = EmulatedNpuLLM
    return _CLASS


def build_llm(*args: Any, **kwargs: Any) -> Any:
    """verl's `LLM(...)` on a CPU host: the A3 engine (`engine_factory.build_engine`) on the emulated npu device."""
    return engine_factory.build_engine(emulated_npu_llm_class(), *args, **kwargs)
