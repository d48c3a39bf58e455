"""How the weight tools end: one clear line and a status, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

from verl_patches.weights.errors import WeightsError


def run_cli(body: Callable[[], int]) -> int:
    """Run a tool's body; a WeightsError is exit 2 with its message, Ctrl-C is 130 with how to resume."""
    try:
        return body()
    except WeightsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: re-run the same command to resume", file=sys.stderr)
        return 130
