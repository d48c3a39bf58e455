"""Where downloads are cached (the user's cache directory, never the repo) and where builds happen."""

from __future__ import annotations

from verl_patches.base.user_cache import user_cache_dir  # noqa: F401  (its home is base; the setup tools name it here)

BUILD_DIR_NAME = ".sources_build"  # beside the package folders, same filesystem, so renames are atomic
STATE_FILE_NAME = ".sources_state.json"
