"""Reading a composed trainer config by dotted key: the one helper every config reader shares (the checks,
the step plan, the preflight, the validation-subset patch), so none of them imports another for it.
Standard library only: it asks ``.get`` and ``in`` of whatever mapping it is handed (an OmegaConf node, a dict)."""

from __future__ import annotations

from typing import Any


def get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """cfg[a][b][c] for "a.b.c", or `default` where any level is missing (no interpolation errors)."""
    node: Any = cfg
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get") or part not in node:
            return default
        node = node.get(part)
    return node
