"""Where `import vllm_ascend.vllm_ascend_C` finds the kernels built by `kernels.py`: the folder is added
to the vendored package's search path (`vllm_ascend.__path__`), so the extension loads under its own name
while the vendored folder stays byte-identical to the lock. Folder: $VERL_PATCHES_VLLM_ASCEND_KERNELS, else
site-packages/vllm_ascend_kernels."""

from __future__ import annotations

import os
from pathlib import Path

from verl_patches.rollout.kernels import default_kernel_dir

ENV = "VERL_PATCHES_VLLM_ASCEND_KERNELS"


def kernel_dir() -> Path:
    return Path(os.environ[ENV]) if os.environ.get(ENV) else default_kernel_dir()


def with_kernel_dir(original: list[str]) -> list[str]:
    folder = str(kernel_dir())
    if folder in original or not os.path.isdir(folder):
        return original  # not built here: vllm-ascend reports the missing extension itself
    return [*original, folder]
