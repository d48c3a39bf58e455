"""``trainer.logger``: each backend one verl v0.4.0 knows and one this Python environment can import.

verl's `Tracking` (verl/utils/tracking.py) asserts a name it does not know and imports a backend's package only
when the driver builds the tracker, after Ray, every worker and the rollout engines are up: on A3 a
``trainer.logger=['console','wandb']`` without wandb installed fails after 256 NPUs came up. `check_config`
asks this module first, so the dry run (the preflight) and the job's start refuse it, naming the key, the
backend and how to install it.

A package counts as installed when it has a real module or package (``importlib.util.find_spec``; the package
is not imported): a bare folder of that name in the working directory (``./wandb/``, where wandb writes its
runs) is a namespace package to Python and is not wandb. Credentials and settings of the backends
(``WANDB_*``, ``SWANLAB_*``, ``MLFLOW_*``, ``CLEARML_*``) reach the driver's Ray process through
`verl_patches.patching.ray_runtime`.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from verl_patches.base.config_access import get

KEY = "trainer.logger"
# verl v0.4.0's Tracking.supported_backend, and the deprecated "tracking" (wandb) it still accepts: the module
# each imports (None: nothing to install) and how to install it. tests/driver/test_logger_backends.py holds the
# names to the pinned verl's list.
BACKENDS: dict[str, tuple[str | None, str]] = {
    "console": (None, ""),
    "tensorboard": ("tensorboard", "pip install tensorboard==2.19.0 (requirements.txt's pin)"),
    "wandb": ("wandb", "pip install wandb"),
    "tracking": ("wandb", "pip install wandb (verl reads 'tracking' as wandb, deprecated: write 'wandb')"),
    "mlflow": ("mlflow", "pip install mlflow"),
    "swanlab": ("swanlab", "pip install swanlab"),
    "vemlp_wandb": ("volcengine_ml_platform", "install Volcano Engine's ML platform SDK (volcengine_ml_platform)"),
    "clearml": ("clearml", "pip install clearml"),
}
FindSpec = Callable[[str], Any]


def installed(module: str, find_spec: FindSpec = importlib.util.find_spec) -> bool:
    """A real top-level module or package of that name is importable here (a namespace folder is not one)."""
    try:
        spec = find_spec(module)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


def backends(cfg: Any) -> list[Any]:
    """``trainer.logger`` as verl reads it: one name or a list of them."""
    value = get(cfg, KEY, ["console"])
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        return list(value)
    except TypeError:
        return [value]


def logger_backend_problems(cfg: Any, find_spec: FindSpec = importlib.util.find_spec) -> list[str]:
    """One line per backend of ``trainer.logger`` that verl does not know or this environment cannot import."""
    problems = []
    for name in backends(cfg):
        if not isinstance(name, str) or name not in BACKENDS:
            close = difflib.get_close_matches(str(name), BACKENDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f"{KEY}: {name!r} is not a logger verl v0.4.0 knows{hint}; use any of "
                f"{', '.join(n for n in BACKENDS if n != 'tracking')}"
            )
            continue
        module, how = BACKENDS[name]
        if module is not None and not installed(module, find_spec):
            problems.append(
                f"{KEY}: backend {name!r} needs the Python package {module!r}, which is not installed for "
                f"{sys.executable}: {how} on every node, or remove {name!r} from {KEY}"
            )
    return problems
