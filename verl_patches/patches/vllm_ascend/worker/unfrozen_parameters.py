"""vllm-ascend's TorchAir graphs built without frozen parameters: weights are graph inputs read at every run.

vllm-ascend 0.9.1's `NPUModelRunner._get_torchair_lazy_compiled_model` sets TorchAir's
``experimental_config.frozen_parameter = True``: a graph binds every `nn.Parameter`'s device address at its
first run and never reads it again. An RL rollout gives its weights new device memory at every step (the
lifecycle frees them for training and re-allocates them before the weight sync), so a frozen graph would
decode from freed memory. This patch compiles upstream's method again from its own source with that one
assignment set to False (TorchAir's default), every other statement upstream's: the weights then enter
each graph run as inputs, like the KV cache and MLA's absorbed matrices already do, and a graph stays valid
however often they move. Nothing is rebuilt per step (`verl_patches.rollout.graph_binding` drops graphs
only for a model runner whose graphs still freeze parameters).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from verl_patches.patching.source_edit import SourceEditError, recompile
from verl_patches.rollout.graph_binding import FROZEN_ATTR


def _is_frozen_parameter_assignment(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return False
    target = stmt.targets[0]
    return (
        isinstance(target, ast.Attribute)
        and target.attr == "frozen_parameter"
        and isinstance(target.value, ast.Attribute)
        and target.value.attr == "experimental_config"
        and isinstance(stmt.value, ast.Constant)
        and stmt.value.value is True
    )


def without_frozen_parameters(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` compiled again from its source with ``...experimental_config.frozen_parameter = False``."""

    def unfreeze(fn: ast.FunctionDef) -> None:
        hits = [s for s in ast.walk(fn) if isinstance(s, ast.stmt) and _is_frozen_parameter_assignment(s)]
        if len(hits) != 1:
            raise SourceEditError(
                f"{original.__module__}.{original.__qualname__}: found {len(hits)} assignments "
                "`<config>.experimental_config.frozen_parameter = True` (expected exactly 1); the patch was "
                "written for vllm-ascend v0.9.1"
            )
        hits[0].value = ast.Constant(False)

    new = recompile(original, unfreeze)
    setattr(new, FROZEN_ATTR, False)
    return new
