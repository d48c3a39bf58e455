"""Where downloads are cached (the user's cache directory, never the repo) and where builds happen."""

from __future__ import annotations

import os
from pathlib import Path

BUILD_DIR_NAME = ".sources_build"  # beside the package folders, same filesystem, so renames are atomic
STATE_FILE_NAME = ".sources_state.json"


def user_cache_dir() -> Path:
    """$VERL_OVERLAY_CACHE, else $XDG_CACHE_HOME/verl_overlay, else ~/.cache/verl_overlay."""
    explicit = os.environ.get("VERL_OVERLAY_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "verl_overlay"
