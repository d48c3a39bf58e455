"""The checkpoint folder a run saves into and resumes from (``trainer.default_local_dir``): who must name it.

verl's default, ``checkpoints/<project>/<experiment>``, is relative: on a cluster every node resolves it in its
own working directory, which is node-local storage unless the checkout itself is shared, and the save of a
step then finds its ranks' files scattered over 16 disks. The A3 profiles therefore have no default
(``${oc.env:CKPT_DIR,null}``): the user names an absolute folder on storage every node mounts. The launch's
preflight and the trainer entry refuse a missing one, and a relative one on a cluster profile, with the same
line (`folder_problem`).
"""

from __future__ import annotations

import os
from typing import Any

from verl_patches.base.config_access import get
from verl_patches.checkpoint.root_access import cluster_run

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


__all__ = ["CKPT_KEY", "CKPT_SETTING", "KEY_TO_CHANGE", "folder_problem"]
