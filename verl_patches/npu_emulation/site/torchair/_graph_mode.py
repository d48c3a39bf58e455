"""torchair's graph-mode entry points vllm-ascend imports by name (patch_for_hcom, CompilerConfig,
get_npu_backend), emulated on a CPU host with TorchAir's contract, not bypassed.

`get_npu_backend(compiler_config)` is a `torch.compile` backend: dynamo traces the model as it does for
TorchAir (vllm-ascend passes `fullgraph=True`, so anything untraceable is an error here exactly as on
A3), and the captured FX graph runs on the CPU. With `experimental_config.frozen_parameter = True` (what
vllm-ascend 0.9.1 sets) TorchAir binds every `nn.Parameter` input's device address at the graph's first
run and never reads it again; a parameter whose storage moved afterwards would silently be read at its
old address on the NPU. Here that is an error naming the parameter (`FrozenParameterMoved`), so a
lifecycle that moves weights under a built graph fails on a CPU host instead of decoding garbage on A3.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any


class _Section:
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.__dict__.setdefault(name, _Section())


class CompilerConfig:
    def __init__(self) -> None:
        self.experimental_config = _Section()
        self.debug = _Section()
        self.dump_config = _Section()


class FrozenParameterMoved(RuntimeError):
    """A frozen parameter's storage is not where the graph bound it at its first run."""


def patch_for_hcom() -> None:
    """TorchAir swaps HCCL collectives for graph-capturable ones; gloo on a CPU host needs no swap."""


def _frozen(config: CompilerConfig | None) -> bool:
    value = getattr(getattr(config, "experimental_config", None), "__dict__", {}).get("frozen_parameter")
    return value is True


def storage_address(t: Any) -> tuple[int, int]:
    """(storage base, element offset): what a graph that binds the tensor's address keeps."""
    return t.untyped_storage().data_ptr(), t.storage_offset()


def parameter_name(placeholder: str) -> str:
    """Dynamo's placeholder name of a parameter as the module path: L_self_modules_layers_modules_0_
    modules_mlp_parameters_weight_ -> layers.0.mlp.weight."""
    name = re.sub(r"^L_(self|fn)_", "", placeholder)
    name = re.sub(r"(^|_)(modules|parameters)_", ".", name)
    return name.strip("._") or placeholder


class FrozenParameterGraph:
    """One compiled graph: runs the FX module; with frozen parameters, checks their addresses."""

    def __init__(self, gm: Any, example_inputs: Sequence[Any], frozen: bool) -> None:
        # lazy: torch is heavy and only this path needs it; importing this module stays light
        import torch

        self.gm = gm
        names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
        self.frozen = (
            [
                (i, parameter_name(names[i]) if i < len(names) else f"input {i}")
                for i, x in enumerate(example_inputs)
                if isinstance(x, torch.nn.Parameter)
            ]
            if frozen
            else []
        )
        self.bound: dict[int, tuple[int, int]] | None = None
        self.runs = 0

    def __call__(self, *args: Any) -> Any:
        if self.frozen:
            now = {i: storage_address(args[i]) for i, _ in self.frozen}
            if self.bound is None:
                self.bound = now
            else:
                moved = [name for i, name in self.frozen if now[i] != self.bound[i]]
                if moved:
                    raise FrozenParameterMoved(
                        f"TorchAir frozen_parameter: {len(moved)} parameter(s) moved after the graph's first run "
                        f"(TorchAir would keep reading the old addresses): {', '.join(moved[:5])}"
                        + (" ..." if len(moved) > 5 else "")
                    )
        self.runs += 1
        return self.gm(*args)


_COMPILED = [0]  # graphs compiled in this process: what a test counts to see a rebuild (TorchAir logs each)


def graphs_compiled() -> int:
    return _COMPILED[0]


def get_npu_backend(compiler_config: CompilerConfig | None = None) -> Callable[..., Any]:
    frozen = _frozen(compiler_config)

    def npu_backend(gm: Any, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        _COMPILED[0] += 1
        return FrozenParameterGraph(gm, example_inputs, frozen)

    return npu_backend
