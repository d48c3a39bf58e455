"""Render MindSpeed-LLM arguments as argv (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def parse_args_from_config(config: Mapping[str, Any]) -> list[str]:
    """Arguments -> argv tokens: `_` in keys becomes `-`; True -> `--k`; False/None omitted; a list or
    tuple -> `--k v1 v2 ...`; anything else -> `--k=value`. Each value is one argv element, never
    shell text."""
    argv: list[str] = []
    for key, value in config.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            if not value:
                continue
            argv.append(flag)
            argv.extend(str(v) for v in value)
        elif isinstance(value, dict):
            raise TypeError(f"argument {key!r}: a mapping cannot be rendered on the command line")
        else:
            argv.append(f"{flag}={value}")
    return argv
