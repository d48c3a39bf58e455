"""Who may change a checkpoint root: the one rule the save, the resume, the dry run and every node apply.

Whoever can write into the checkpoint root, or into a folder above it, can replace a whole step folder (or the
root itself); the run's signature (`run_identity`) keeps such a step from being resumed, but not from being
swapped in, removed, or from breaking the saves. So the root must be this account's and writable by no one
else, sticky or not, and every level above it only root's or ours, writable by others only when sticky
(`base.folder_access` reads the levels). On a cluster profile (`cluster_run`: an A3 profile, not the tiny one)
a root that fails this is refused, unless the user accepts the risk by name with
``VERL_PATCHES_ALLOW_SHARED_CKPT_ROOT=1`` (then one warning line names it); elsewhere (the tiny run, the CPU
proof) it is one warning line per process. A root anyone can write into without the sticky bit is refused
everywhere, accepted risk or not.

The save (`commit.begin_step`), the resume (`commit.find_resume_and_why`), the dry run
(`launch.preflight.checkpoint`) and the launch's check on every node (`launch.cluster.storage_probe`) call
`root_verdict` with the same inputs, so they cannot disagree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_patches.base import env_registry
from verl_patches.base.config_access import get
from verl_patches.base.folder_access import access_problem
from verl_patches.base.overlay_settings import overlay_settings

ALLOW_SHARED_ROOT_ENV = "VERL_PATCHES_ALLOW_SHARED_CKPT_ROOT"
_OPT_IN = f"{ALLOW_SHARED_ROOT_ENV}=1"


class CheckpointRootError(Exception):
    """A checkpoint root the job will not use, or a save that would replace a folder this root's saves did not
    create; one line naming the folder and the way out."""


def allow_shared_root(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user accepted a checkpoint root others can change (`ALLOW_SHARED_ROOT_ENV`, the one
    grammar of switches: a value such as ``yes please`` is an `EnvError` naming the variable)."""
    return env_registry.flag(ALLOW_SHARED_ROOT_ENV, environ)


def cluster_run(cfg: Any) -> bool:
    """The config targets an NPU cluster: an A3 profile, whatever this host is (the tiny profile follows the
    host's device and never is, even on an NPU machine). The one rule of "cluster profile": the preflight's
    ``Context.cluster_profile``, the trainer's checkpoint-folder check (``trainer.checkpoint_folder``), its
    save and resume and the launch call this, on the composed config."""
    return bool(get(cfg, "trainer.device") == "npu" and overlay_settings(cfg).profile != "tiny")


@dataclass(frozen=True)
class RootVerdict:
    refusal: str = ""  # one line: the root is not used
    warning: str = ""  # one line: used, and the risk named


def root_verdict(root: str | os.PathLike[str], *, cluster: bool, allow_shared: bool) -> RootVerdict:
    """The rule of the module for an existing root (a missing one: nothing to judge yet, no line)."""
    root = Path(root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return RootVerdict()
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o002 and not mode & stat.S_ISVTX:
        return RootVerdict(
            refusal=f"{root}: writable by every user and not sticky (mode {mode:o}); refused: chmod 700 {root}"
        )
    try:
        problem = access_problem(root, private=True)
    except OSError as err:
        return RootVerdict(refusal=f"{root}: its permissions cannot be read ({err.strerror or err}); refused")
    if problem is None:
        return RootVerdict()
    if allow_shared:
        return RootVerdict(
            warning=f"verl_patches checkpoint: {root}: others can change what is saved there ({problem}); used "
            f"because {_OPT_IN}: a step they replace is not resumed (its signature fails), but they can remove steps"
        )
    if cluster:
        return RootVerdict(
            refusal=f"{root}: others can change what is saved there ({problem}); refused on the cluster: make it "
            f"yours alone (chmod go-w on the level named, or mkdir -m 700 a root of your own), or set {_OPT_IN} "
            "to accept the risk by name"
        )
    return RootVerdict(
        warning=f"verl_patches checkpoint: {root}: others can change what is saved there ({problem}); refused on "
        f"a cluster profile unless {_OPT_IN}"
    )


_SAID: set[str] = set()


def check_root_access(
    root: str | os.PathLike[str],
    *,
    cluster: bool,
    environ: Mapping[str, str] | None = None,
    say: Callable[[str], Any] = print,
) -> None:
    """`root_verdict` acted on: `CheckpointRootError` for a refusal, the warning line said once per process."""
    verdict = root_verdict(root, cluster=cluster, allow_shared=allow_shared_root(environ))
    if verdict.refusal:
        raise CheckpointRootError(verdict.refusal)
    if verdict.warning and verdict.warning not in _SAID:
        _SAID.add(verdict.warning)
        say(verdict.warning)


__all__ = [
    "ALLOW_SHARED_ROOT_ENV",
    "CheckpointRootError",
    "RootVerdict",
    "allow_shared_root",
    "check_root_access",
    "cluster_run",
    "root_verdict",
]
