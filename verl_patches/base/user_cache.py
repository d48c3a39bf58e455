"""The user's download cache of this overlay: where fetched archives and wheels live, never in the repo.

One home for the folder's name, so the setup tools (``verl_patches/sources``) and the torch_npu emulation,
which reads the pinned torch_npu wheel from the cache, find the same place.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """$VERL_OVERLAY_CACHE, else $XDG_CACHE_HOME/verl_overlay, else ~/.cache/verl_overlay."""
    explicit = os.environ.get("VERL_OVERLAY_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "verl_overlay"
