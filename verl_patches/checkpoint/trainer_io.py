"""The driver's side of a step checkpoint and of a resume (``RayPPOTrainer._save_checkpoint`` /
``_load_checkpoint`` under our declared patches).

Save: the workers write into ``.staging-global_step_N/<role>``, the driver adds the dataloader position,
checks every rank's record, writes the manifest and renames the folder into place (`commit.commit_step`),
then prunes to ``trainer.max_actor_ckpt_to_keep``. With ``overlay.async_checkpoint`` (`background_saves`) the
Megatron actor's workers only take their snapshot in the save call and write the files in the background
(issue 42); the step is then a `PendingSave` until the fit loop has every worker's write fenced (before the
next ``update_actor``, and at the end of the run) and calls `commit_pending`, which commits and prunes as above:
the manifest, the rename and the tracker come only after every rank's write finished and its record checks
out, so until then the last committed step is still the one a resume takes. Resume: the newest complete checkpoint (or
``trainer.resume_from_path``), its actor (and critic) through the workers' ``load_checkpoint``, the
dataloader position, the step counter; one line says from where. MindSpeed's D1 flags ``finetune``,
``no_load_optim`` and ``no_load_rng`` only concern the first load from a converted checkpoint (C1 reads
weights only); a resume always restores the optimizer and RNG states.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import write_atomically
from verl_patches.base.overlay_settings import overlay_settings
from verl_patches.checkpoint import commit
from verl_patches.checkpoint.confine import ConfinementError, confined_path
from verl_patches.checkpoint.manifest import CheckpointIncomplete
from verl_patches.checkpoint.plan import parse_step_dir
from verl_patches.checkpoint.root_access import check_root_access, cluster_run
from verl_patches.checkpoint.safe_load import load_tensor_file

DATA_FILE = "data.pt"
LOG_PREFIX = "verl_patches checkpoint:"
RESUME_PREFIX = "verl_patches resume:"
_PENDING_ATTR = "_verl_patches_pending_save"  # on the trainer: the step saved last, written in the background
_FENCED_ATTR = "_verl_patches_fences_saves"  # on the trainer: its fit loop fences before every update


@dataclass
class PendingSave:
    """A step whose files the workers are writing in the background: committed by `commit_pending`."""

    root: Path
    staging: Path
    step: int
    keep: int | None
    extra: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0  # time.monotonic() when the save was called
    snapshot_s: float = 0.0  # how long the save call blocked the driver


def fence_before_updates(trainer: Any) -> None:
    """Called by a fit loop that waits for a pending save's writes before every ``update_actor`` and at its end
    (`verl_patches.driver.fit_loop`): only then may `save_step` leave the files to the background."""
    setattr(trainer, _FENCED_ATTR, True)


def background_saves(trainer: Any) -> bool:
    """Whether `save_step` writes this trainer's checkpoints in the background: ``overlay.async_checkpoint`` is
    on, the fit loop fences before updates, and the actor is verl's Megatron worker (ours takes ``background``)
    with no critic (verl's critic saves in the foreground)."""
    # lazy: OmegaConf is heavy and only this path needs it; importing this module stays light
    from omegaconf import OmegaConf

    cfg = trainer.config
    on = overlay_settings(cfg).async_checkpoint  # overlay.async_checkpoint
    strategy = OmegaConf.select(cfg, "actor_rollout_ref.actor.strategy", default=None)
    return (
        on
        and bool(getattr(trainer, _FENCED_ATTR, False))
        and strategy == "megatron"
        and not getattr(trainer, "use_critic", False)
    )


def pending_save(trainer: Any) -> PendingSave | None:
    return getattr(trainer, _PENDING_ATTR, None)


def abandon_pending(trainer: Any) -> None:
    """Forget the pending save (a worker's write failed): it is never committed."""
    setattr(trainer, _PENDING_ATTR, None)


def checkpoint_root(trainer_cfg: Any) -> Path:
    if trainer_cfg.get("default_hdfs_dir", None) is not None:
        raise NotImplementedError(
            "trainer.default_hdfs_dir: remote checkpoints are not supported by the overlay; "
            "set it to null and point trainer.default_local_dir at shared storage"
        )
    return Path(os.path.abspath(trainer_cfg.default_local_dir))


def keep_last(trainer_cfg: Any) -> int | None:
    if trainer_cfg.get("remove_previous_ckpt_in_save", False):
        return 1
    keep = trainer_cfg.get("max_actor_ckpt_to_keep", None)
    return int(keep) if keep else None


def save_step(trainer: Any) -> Path | None:
    """Write, check and commit the checkpoint of ``trainer.global_steps``; prune old ones. With background
    saves (`background_saves`) the workers only take their snapshot here: the step is left pending (None is
    returned) and `commit_pending` commits it once every worker's write is fenced."""
    import torch  # here, not at import: the dry run reads the resume step through `resume_dir` without torch

    t0 = time.monotonic()
    cfg = trainer.config.trainer
    root, step = checkpoint_root(cfg), int(trainer.global_steps)
    pending = pending_save(trainer)
    if pending is not None:
        raise RuntimeError(
            f"checkpoint step {step}: step {pending.step}'s background save was never fenced and "
            "committed (the fit loop fences before every update_actor)"
        )
    background = background_saves(trainer)
    staging = commit.begin_step(root, step, cluster=cluster_run(trainer.config))
    if background:
        trainer.actor_rollout_wg.save_checkpoint(
            str(staging / "actor"), None, step, max_ckpt_to_keep=None, background=True
        )
    else:
        trainer.actor_rollout_wg.save_checkpoint(str(staging / "actor"), None, step, max_ckpt_to_keep=None)
    if getattr(trainer, "use_critic", False):
        trainer.critic_wg.save_checkpoint(str(staging / "critic"), None, step, max_ckpt_to_keep=None)
    write_atomically(staging / DATA_FILE, lambda p: torch.save(trainer.train_dataloader.state_dict(), p))
    extra = {"total_training_steps": trainer.total_training_steps}
    if background:
        took = time.monotonic() - t0
        setattr(trainer, _PENDING_ATTR, PendingSave(root, staging, step, keep_last(cfg), extra, t0, took))
        print(
            f"{LOG_PREFIX} step {step}: snapshot taken in {took:.1f}s; its files are being written in the background "
            f"into {staging} (committed once every rank's write is done, before the next update)",
            flush=True,
        )
        return None
    final = commit.commit_step(root, staging, step, extra=extra)
    pruned = commit.prune(root, keep_last(cfg), protect=(final.name,))
    print(
        f"{LOG_PREFIX} step {step} saved to {final} in {time.monotonic() - t0:.1f}s"
        f"{f'; pruned {pruned}' if pruned else ''}",
        flush=True,
    )
    return final


def commit_pending(trainer: Any, fenced: Sequence[Mapping[str, Any]], waited_s: float) -> dict[str, float]:
    """Commit the pending background save once every worker's write was fenced (``fenced``: their
    `background_write.FenceResult.to_dict`; ``waited_s``: how long the fence held the driver). The commit checks
    every rank's record, as a save in the foreground does. Returns the step's checkpoint metrics."""
    pending = pending_save(trainer)
    if pending is None:
        return {}
    setattr(trainer, _PENDING_ATTR, None)  # committed or refused: either way, never twice
    final = commit.commit_step(pending.root, pending.staging, pending.step, extra=pending.extra)
    pruned = commit.prune(pending.root, pending.keep, protect=(final.name,))
    write_s = max((float(r.get("write_s", 0.0)) for r in fenced), default=0.0)
    nbytes = sum(int(r.get("nbytes", 0)) for r in fenced)
    print(
        f"{LOG_PREFIX} step {pending.step} saved to {final} in the background: {nbytes / 1e9:.3f} GB written in "
        f"{write_s:.1f}s (slowest rank), the save call blocked {pending.snapshot_s:.1f}s and the fence "
        f"{waited_s:.1f}s{f'; pruned {pruned}' if pruned else ''}",
        flush=True,
    )
    return {
        "checkpoint/write_s": write_s,
        "checkpoint/fence_wait_s": float(waited_s),
        "checkpoint/snapshot_s": pending.snapshot_s,
        "checkpoint/committed_step": float(pending.step),
    }


def resume_dir(
    trainer_cfg: Any, *, cluster: bool = False, say: Callable[[str], Any] = print
) -> tuple[Path | None, str]:
    """The step folder to resume from (or None) and a note for the log line. The checkpoint root (or the named
    step's) must pass `root_access.check_root_access` (``cluster``: the run is on a cluster profile; ``say``
    gets its warning line)."""
    mode = trainer_cfg.get("resume_mode", "auto")
    root = checkpoint_root(trainer_cfg)
    if mode == "disable":
        return None, "resume_mode=disable"
    if mode == "resume_path":
        given = trainer_cfg.get("resume_from_path", None)
        if not isinstance(given, str) or parse_step_dir(Path(given).name) is None:
            raise ValueError(f"trainer.resume_from_path={given!r}: must name a global_step_N folder")
        path = Path(os.path.abspath(given))
        check_root_access(path.parent, cluster=cluster, say=say)
        commit.read_manifest(path)  # a clear error when it is not a complete, signed checkpoint
        problem = commit.step_problem(path) or commit.small_files_problem(path)
        if problem:
            raise CheckpointIncomplete(f"trainer.resume_from_path={given!r}: {problem}")
        return path, "trainer.resume_from_path"
    if mode != "auto":
        raise ValueError(f"trainer.resume_mode={mode!r}: expected auto, resume_path or disable")
    point, why = commit.find_resume_and_why(root, cluster=cluster, say=say)
    return (root / point.name if point is not None else None), why


def load_latest(trainer: Any) -> int:
    """Resume the trainer in place; returns the step resumed from (0: from scratch)."""
    path, note = resume_dir(trainer.config.trainer, cluster=cluster_run(trainer.config))
    if path is None:
        print(f"{RESUME_PREFIX} starting from step 0 ({note})", flush=True)
        return 0
    manifest = commit.read_manifest(path)
    step = manifest.step
    record = manifest.files.get(DATA_FILE)
    if record is None:
        raise CheckpointIncomplete(f"{path / 'checkpoint.json'}: does not list {DATA_FILE} (the dataloader position)")
    try:
        data = confined_path(path, DATA_FILE, str(path / "checkpoint.json"))
    except ConfinementError as err:
        raise CheckpointIncomplete(str(err)) from None
    position = load_tensor_file(data, expected_sha256=record.sha256)  # checked before any worker loads
    trainer.actor_rollout_wg.load_checkpoint(str(path / "actor"), del_local_after_load=False)
    if getattr(trainer, "use_critic", False):
        trainer.critic_wg.load_checkpoint(str(path / "critic"), del_local_after_load=False)
    trainer.train_dataloader.load_state_dict(position)
    trainer.global_steps = step
    actor = manifest.roles.get("actor")
    layout = f"actor TP{actor.tp}xPP{actor.pp}xEP{actor.ep} DP{actor.dp}; " if actor else ""
    print(
        f"{RESUME_PREFIX} from {path} (step {step}; {layout}model, optimizer, RNG and dataloader restored)"
        f"{f'; {note}' if note else ''}",
        flush=True,
    )
    return step
