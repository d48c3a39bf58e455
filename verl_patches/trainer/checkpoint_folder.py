"""The checkpoint folder a run saves into and resumes from (``trainer.default_local_dir``): who must name it.

verl's default, ``checkpoints/<project>/<experiment>``, is relative: on a cluster every node resolves it in its
own working directory, which is node-local storage unless the checkout itself is shared, and the save of a
step then finds its ranks' files scattered over 16 disks. The A3 profiles therefore have no default
(``${oc.env:CKPT_DIR,null}``): the user names an absolute folder on storage every node mounts. The launch's
preflight and the trainer entry refuse a missing one, and a relative one on a cluster profile, with the same
line (`folder_problem`). The trainer entry also judges, before anything starts, who may change the roots the
run will save into or resume from (`root_problem`): the save and the resume apply that rule again, but inside
a Ray worker, where a refusal is a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_patches.base.config_access import get
from verl_patches.base.env_flags import EnvError
from verl_patches.checkpoint.root_access import CheckpointRootError, check_root_access, cluster_run

CKPT_KEY = "trainer.default_local_dir"
CKPT_SETTING = "CKPT_DIR"  # the launch setting the A3 profiles read it from
KEY_TO_CHANGE = f"{CKPT_SETTING} / {CKPT_KEY}"


def folder_problem(cfg: Any) -> str | None:
    """One line when the checkpoint folder is missing, or relative on a cluster profile; None when usable."""
    raw = get(cfg, CKPT_KEY)
    if raw is None or not str(raw).strip():
        return (
            f"{CKPT_KEY} is not set: name the checkpoint folder, an absolute path on storage every node mounts "
            f"({CKPT_SETTING}=/shared/ckpt/<run> in the --env-file or --ckpt-dir, or {CKPT_KEY}=... after --)"
        )
    if cluster_run(cfg) and not os.path.isabs(str(raw)):
        return (
            f"{CKPT_KEY}={str(raw)[:200]!r} is relative: each node would resolve it in its own working directory, "
            f"on its own disk unless the checkout is shared; give an absolute folder every node mounts ({CKPT_SETTING})"
        )
    return None


def roots_used(cfg: Any) -> list[Path]:
    """The checkpoint roots the run touches, as `checkpoint.trainer_io` resolves them (relative to this working
    directory): ``trainer.default_local_dir`` when it saves (``trainer.save_freq`` > 0) or resumes the newest
    step (``trainer.resume_mode`` auto), and the folder holding ``trainer.resume_from_path`` when that is how
    it resumes."""
    mode = get(cfg, "trainer.resume_mode", "auto")
    save_freq = get(cfg, "trainer.save_freq", -1)
    saves = isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0
    roots = []
    raw = get(cfg, CKPT_KEY)
    if raw is not None and str(raw).strip() and (saves or mode == "auto"):
        roots.append(Path(os.path.abspath(str(raw))))
    given = get(cfg, "trainer.resume_from_path")
    if mode == "resume_path" and isinstance(given, str) and given.strip():
        roots.append(Path(os.path.abspath(given)).parent)
    return roots


def root_problem(cfg: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """One line when a root of `roots_used` is one the save or the resume would refuse
    (`checkpoint.root_access.check_root_access`: others can change it, on a cluster profile; or a bad
    ``VERL_PATCHES_ALLOW_SHARED_CKPT_ROOT``); None otherwise, the warning line of an accepted risk said once."""
    cluster = cluster_run(cfg)
    try:
        for root in roots_used(cfg):
            check_root_access(root, cluster=cluster, environ=environ)
    except (CheckpointRootError, EnvError) as err:
        return str(err)
    return None


__all__ = ["CKPT_KEY", "CKPT_SETTING", "KEY_TO_CHANGE", "folder_problem", "root_problem", "roots_used"]
