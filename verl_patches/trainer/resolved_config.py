"""The config a run ran with, saved in its run folder as ``resolved_config.yaml``.

The trainer entry composes our config on top of verl's, applies the profile and the user's overrides and resolves
every interpolation (paths from the environment included) before verl sees it; that resolved config is what the
run did, so it is the one saved, by the entry, before any worker starts. A header comment names the entry's
config and overrides (as JSON: an override's text cannot end the comment). Written whole or not at all
(`base.atomic_write`), private to the account (0600: it holds the cluster's paths), by path: the run folder is
the launcher's private one (`launch.run_dir` says why a path into it is safe).

The run folder is `rank_memory.run_dir` (``VERL_PATCHES_RUN_DIR``, else the parent of ``TENSORBOARD_DIR``, which the
launcher sets to ``logs/<run>/tensorboard``); without either (the entry run by hand) nothing is saved.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import write_text_atomically

FILE_NAME = "resolved_config.yaml"


def config_text(cfg: Any, config_name: str, overrides: Sequence[str]) -> str:
    """The file's text (pure): the header, then `cfg` (resolved) as YAML."""
    # lazy: OmegaConf is heavy and only this path needs it; importing this module stays light
    from omegaconf import OmegaConf

    header = (
        "# The resolved config this run ran with (verl_patches.trainer.main_ppo_npu).\n"
        f"# config: {json.dumps(config_name)}; overrides: {json.dumps(list(overrides))}\n"
    )
    return header + OmegaConf.to_yaml(cfg, resolve=True)


def save_resolved_config(cfg: Any, config_name: str, overrides: Sequence[str], folder: Path | None) -> Path | None:
    """``folder/resolved_config.yaml`` written (the path), or None when there is no run folder; OSError when it
    cannot be written."""
    if folder is None:
        return None
    target = Path(folder) / FILE_NAME
    write_text_atomically(target, config_text(cfg, config_name, overrides), mode=0o600)
    return target
