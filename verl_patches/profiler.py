"""NPUProfiler (vendor item C9): profile a stage of chosen ranks, gated by PROFILE_UPDATE.

On an NPU it is torch_npu.profiler at Level2 with AiC ArithmeticUtilization, shapes and memory recorded
(`verl_patches.device.profiler`); elsewhere torch.profiler with the same schedule, so the gating and the
trace layout are exercised on a CPU. Traces go to ``<root>/<stage>`` as TensorBoard files. On a rank not
in `ranks`, or with PROFILE_UPDATE unset or off (`verl_patches.base.env_flags`), every call is a no-op.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from verl_patches import device
from verl_patches.base import env_registry
from verl_patches.tools import _rank

PROFILE_ENV = "PROFILE_UPDATE"
DEFAULT_ROOT = "./profiling"


def profiling_requested(environ: Mapping[str, str] | None = None) -> bool:
    return env_registry.flag(PROFILE_ENV, environ)


class NPUProfiler:
    """``start()`` / ``step()`` / ``stop()`` (or ``with``) around the steps to profile."""

    def __init__(
        self,
        stage: str,
        ranks: Iterable[int] = (0,),
        rank: int | None = None,
        active_steps: int = 1,
        warmup_steps: int = 0,
        root: str | os.PathLike = DEFAULT_ROOT,
        environ: Mapping[str, str] | None = None,
        factory: Callable[..., Any] | None = None,
    ) -> None:
        if not stage or "/" in stage or stage in (".", ".."):
            raise ValueError(f"NPUProfiler: stage must be a plain folder name, got {stage!r}")
        if rank is None:
            rank = _rank()
        self.rank = rank
        self.output_dir = Path(root) / stage
        self.enabled = profiling_requested(environ) and rank in set(ranks)
        self._kwargs = {"active_steps": active_steps, "warmup_steps": warmup_steps}
        self._factory = factory
        self._prof: Any = None

    def start(self) -> None:
        if not self.enabled or self._prof is not None:
            return
        factory = self._factory
        if factory is None:
            factory = device.profiler
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._prof = factory(str(self.output_dir), **self._kwargs)
        self._prof.start()

    def step(self) -> None:
        if self._prof is not None:
            self._prof.step()

    def stop(self) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.stop()

    def __enter__(self) -> NPUProfiler:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
