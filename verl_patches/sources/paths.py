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


def detect_device() -> str:
    """npu | cuda | cpu, without importing torch (setup runs before dependencies are installed)."""
    forced = os.environ.get("VERL_OVERLAY_DEVICE")
    if forced:
        if forced not in ("npu", "cuda", "cpu"):
            raise ValueError(f"VERL_OVERLAY_DEVICE={forced!r}: expected npu, cuda or cpu")
        return forced
    if Path("/dev/davinci0").exists() or Path("/dev/davinci_manager").exists():
        return "npu"
    if Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists():
        return "cuda"
    return "cpu"
