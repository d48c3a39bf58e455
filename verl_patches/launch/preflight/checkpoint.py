"""Preflight: the checkpoint folder, what checkpointing costs, and which step a resume would take.

* ``checkpoint.folder``: ``trainer.default_local_dir`` is named, and absolute on a cluster profile
  (`trainer.checkpoint_folder.folder_problem`, the trainer entry's own rule);
* ``checkpoint.cadence``: how often a step is saved, its size from the model config, how many are kept, the
  work a failure loses at the vendor's step time, and what a save blocks the step for: in the foreground the
  whole write, in the background (``overlay.async_checkpoint``) its snapshot and what the write has not finished
  at the fence before the next update, with the host memory the write holds on the busiest node (`run_costs`);
* ``checkpoint.storage``: on this host, the folder exists, the job may write there (a file is created and
  removed), no other account can change it (`checkpoint.root_access.root_verdict`, the save's and the
  resume's own rule: on a cluster profile a root others can write into, or a level above it, is refused
  unless ``VERL_PATCHES_ALLOW_SHARED_CKPT_ROOT=1``), and it has room for the steps
  kept plus the one being written (a refusal states the trade-off of keeping one step instead of two); a
  folder on a local filesystem type is named (other nodes see it only if this host exports it);
* ``checkpoint.nodes``: the same storage, writable, on every node: only the nodes can answer, so the launch
  asks each of them once Ray is up (`checkpoint_nodes`); the dry run says so;
* ``checkpoint.resume``: the step a resume would start from, read as the resume reads it
  (`checkpoint.trainer_io.resume_dir`: the root's tracker, the newest complete step, its small files); a
  tracker file the resume's reader (`checkpoint.tracker`) refuses is a warning naming it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl_patches.base import mount_table
from verl_patches.base.env_flags import EnvError
from verl_patches.base.job_layout import job_layout
from verl_patches.checkpoint.commit import listing, read_root_tracker
from verl_patches.checkpoint.manifest import CheckpointIncomplete
from verl_patches.checkpoint.plan import TRACKER_FILE, parse_step_dir
from verl_patches.checkpoint.root_access import (
    ALLOW_SHARED_ROOT_ENV,
    CheckpointRootError,
    allow_shared_root,
    root_verdict,
)
from verl_patches.checkpoint.trainer_io import resume_dir
from verl_patches.launch.preflight.findings import FAIL, NOT_CHECKED, OK, WARN, Context, Finding, get
from verl_patches.launch.preflight.memory import training_setup
from verl_patches.launch.preflight.memory_estimate import rank_params
from verl_patches.launch.preflight.run_costs import (
    CHECKPOINT_BYTES_NOTE,
    GATHER_BYTES_PER_S,
    STORAGE_WRITE_BYTES_PER_S,
    VENDOR_SOURCE,
    RankLayout,
    VendorStep,
    background_save_rank_bytes,
    busiest_node,
    checkpoint_step,
    dense_gather_bytes,
    hidden_bandwidth,
    human_bytes,
    human_seconds,
    offloaded_host_bytes,
    room_needed,
    save_timing,
    saves_in_run,
    vendor_step,
)
from verl_patches.reshard.model_dims import ModelDims
from verl_patches.trainer.checkpoint_folder import CKPT_KEY, CKPT_SETTING, KEY_TO_CHANGE, folder_problem

KEEP_KEY = "trainer.max_actor_ckpt_to_keep"
SAVE_KEY = "trainer.save_freq"
ASYNC_KEY = "overlay.async_checkpoint"  # named in the lines; read through ctx.overlay
# filesystems that live on one machine: another node sees such a folder only if this host exports it
LOCAL_FS_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "ramfs", "overlay", "vfat", "zfs"})
# Filesystems that are never a checkpoint folder shared by the nodes: a RAM filesystem or a container's own
# layer. A local disk (ext4, xfs...) can still be exported to the others by this host, so it is only a warning here
# and the launch's per-node marker check decides.
NEVER_SHARED_FS_TYPES = frozenset({"tmpfs", "ramfs", "overlay"})


def save_freq(cfg: Any) -> int:
    value = get(cfg, SAVE_KEY, -1)
    return int(value) if value is not None else -1


def keep_count(cfg: Any) -> int | None:
    """Steps kept after each save (the trainer's `trainer_io.keep_last`): None keeps every one."""
    if get(cfg, "trainer.remove_previous_ckpt_in_save", False):
        return 1
    keep = get(cfg, KEEP_KEY)
    return int(keep) if keep else None


def folder_path(ctx: Context) -> Path | None:
    """The checkpoint root as the trainer resolves it (its working directory is the repo root), or None when
    `folder_problem` refuses it."""
    if folder_problem(ctx.cfg):
        return None
    p = Path(str(get(ctx.cfg, CKPT_KEY)))  # as `trainer_io.checkpoint_root` reads it: no '~' expansion
    return p if p.is_absolute() else ctx.root / p


def kept_steps_present(folder: Path) -> int:
    """Complete steps this root's saves wrote (the ones pruning counts against the steps kept)."""
    try:
        return sum(
            1 for name, e in listing(folder).items() if e.complete and e.ours and parse_step_dir(name) is not None
        )
    except OSError:
        return 0


def run_saves(cfg: Any) -> int | None:
    total = get(cfg, "trainer.total_training_steps")
    return saves_in_run(save_freq(cfg), int(total) if total is not None else None)


def room_note(cfg: Any, step_bytes: int) -> str:
    keep, saves = keep_count(cfg), run_saves(cfg)
    if keep is None:
        note = f"the next step ({human_bytes(step_bytes)}; every step is kept: {KEEP_KEY} is unset)"
    else:
        note = f"{keep} kept step(s) ({KEEP_KEY}) + 1 being written, {human_bytes(step_bytes)} each"
    if saves is not None and (keep is None or saves < keep + 1):
        note += f"; the run saves {saves} step(s) (trainer.total_training_steps)"
    return note


def keep_tradeoff(cfg: Any, step_bytes: int) -> str:
    """Keeping two steps or one, said where the room is refused: what each needs and what each risks."""
    keep = keep_count(cfg)
    two, one = human_bytes(3 * step_bytes), human_bytes(2 * step_bytes)
    one_risk = "a damaged newest step leaves none to resume from"
    if keep == 1:
        return (
            f"keep 1 ({KEEP_KEY}=1) needs 2 steps of space ({one}) because a save commits before it prunes, and "
            f"{one_risk}; keep 2 (the default) needs 3 ({two})"
        )
    lead = (
        f"keep {keep}" + (" (the default)" if keep == 2 else f" ({KEEP_KEY}={keep})") if keep else "keeping every step"
    )
    room = (
        f"needs {keep + 1} steps of space ({human_bytes((keep + 1) * step_bytes)})"
        if keep
        else "needs a step more per save"
    )
    return (
        f"{lead} {room} because a save commits before it prunes; keep 1 ({KEEP_KEY}=1) needs 2 steps ({one}) "
        f"but {one_risk}"
    )


def checkpoint_room(cfg: Any, model: Mapping[str, Any], folder: Path | None) -> tuple[int, str]:
    """(free bytes the folder needs now, what for): the steps kept plus the one being written, less the steps
    of this root already there, at most the steps the run saves."""
    step = checkpoint_step(model).nbytes
    present = kept_steps_present(folder) if folder is not None and folder.is_dir() else 0
    note = room_note(cfg, step) + (f", {present} already there" if present else "")
    return room_needed(step, keep_count(cfg), present, run_saves(cfg)), note


# ---- the findings --------------------------------------------------------------------------------


def checkpoint_folder_findings(ctx: Context, model: Mapping[str, Any]) -> list[Finding]:
    problem = folder_problem(ctx.cfg)
    folder = folder_path(ctx)
    out = [
        Finding("checkpoint.folder", FAIL, problem, KEY_TO_CHANGE)
        if problem
        else Finding("checkpoint.folder", OK, f"{CKPT_KEY}={folder}"),
        cadence_finding(ctx, model),
    ]
    if folder is None:
        return out
    if save_freq(ctx.cfg) > 0:
        out += storage_findings(ctx, model, folder)
        if ctx.cluster_profile:
            out.append(nodes_finding(ctx, folder))
    out.append(resume_finding(ctx, folder))
    return out


def cadence_finding(ctx: Context, model: Mapping[str, Any]) -> Finding:
    freq = save_freq(ctx.cfg)
    if freq <= 0:
        if ctx.cluster_profile:
            return Finding(
                "checkpoint.cadence",
                WARN,
                f"checkpoints off ({SAVE_KEY}={freq}): a failure loses every step since the start (the A3 profiles "
                f"save every 10 steps)",
                SAVE_KEY,
            )
        return Finding("checkpoint.cadence", OK, f"checkpoints off ({SAVE_KEY}={freq})")
    step = checkpoint_step(model)
    keep, saves = keep_count(ctx.cfg), run_saves(ctx.cfg)
    on_disk = (keep + 1 if saves is None else min(keep + 1, saves)) if keep else None
    kept = (
        f"{keep} kept ({KEEP_KEY}) and a save commits before it prunes: at most {on_disk} on disk at once "
        f"({human_bytes(on_disk * step.nbytes)})"
        if keep and on_disk is not None
        else f"every step kept ({KEEP_KEY} unset): {human_bytes(step.nbytes)} more per save"
    )
    in_run = "" if saves is None else f", {saves} in this run of {get(ctx.cfg, 'trainer.total_training_steps')} steps"
    text = (
        f"a step saved every {freq} steps and at the last ({SAVE_KEY}={freq}{in_run}); one step is "
        f"{human_bytes(step.nbytes)} ({step.params / 1e9:.2f} B parameters x {CHECKPOINT_BYTES_NOTE}); {kept}"
    )
    vendor = vendor_step(ctx.overlay.profile)
    if vendor is not None:
        text += (
            f"; a failure loses at most {freq} steps ({human_seconds(freq * vendor.step_s)} at {vendor.step_s} s a "
            f"step, {VENDOR_SOURCE})"
        )
        note, fits = blocking_note(ctx, model, vendor, freq)
        text += "; " + note
        if not fits:
            return Finding("checkpoint.cadence", FAIL, text, ASYNC_KEY)
    return Finding("checkpoint.cadence", OK if keep else WARN, text, "" if keep else KEEP_KEY)


def rank_layout(cfg: Any, model: Mapping[str, Any]) -> RankLayout:
    """The training ranks' placement and per-stage parameters, as the memory estimate reads the config."""
    t = training_setup(cfg, model)
    shape = ModelDims.from_hf_config(model)
    return RankLayout(
        tp=t.tp,
        cp=t.cp,
        dp=t.dp,
        expert_dp=max(t.dp // max(t.ep, 1), 1),
        ranks_per_node=job_layout(cfg).cluster.dies_per_node,
        stage_params=tuple(rank_params(shape, t.tp, t.ep, t.layer_list, s) for s in range(t.pp)),
    )


def host_memory_bytes() -> int | None:
    """This host's physical memory (bytes), None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# The share of a node's memory the offloaded state and a background write may take together: the rest is the
# processes' own (Ray, the rollout engine's host side, the data loader, the page cache the write goes through).
HOST_MEMORY_SHARE = 0.9


def blocking_note(ctx: Context, model: Mapping[str, Any], vendor: VendorStep, freq: int) -> tuple[str, bool]:
    """What a save blocks the step for, in the foreground and in the background (`run_costs.save_timing`), and
    the host memory a background write holds on the busiest node; False with it when, on an NPU node, that
    write and the offloaded state would not fit in `HOST_MEMORY_SHARE` of the node's memory."""
    cfg = ctx.cfg
    if ctx.layout is None:
        return "what a save blocks is not estimated: the layout is refused (see layout.*)", True
    step = checkpoint_step(model).nbytes
    layout = rank_layout(cfg, model)
    t = training_setup(cfg, model)
    timing = save_timing(step, int(dense_gather_bytes(layout)), vendor.before_update_s)
    assumed = (
        f"storage writing {STORAGE_WRITE_BYTES_PER_S / 1e9:.0f} GB/s and the snapshot's DP gather "
        f"{GATHER_BYTES_PER_S / 1e9:.0f} GB/s (assumptions)"
    )
    fg = f"{timing.foreground_s:.0f} s ({100 * timing.foreground_s / (freq * vendor.step_s):.0f} % of the {freq} steps)"
    if not ctx.overlay.async_checkpoint:
        return (
            f"a save blocks the step for its whole write, {fg}, at {assumed}; {ASYNC_KEY}=True writes it in the "
            f"background (about {timing.background_s:.0f} s blocked)",
            True,
        )
    node, held = busiest_node(layout, lambda r: background_save_rank_bytes(layout, r, t.swap_optimizer))
    steady = busiest_node(
        layout, lambda r: offloaded_host_bytes(layout, r, t.param_offload, t.ref_param_offload, t.swap_optimizer)
    )[1]
    note = (
        f"a save is written in the background ({ASYNC_KEY}=True) and blocks about {timing.background_s:.0f} s: "
        f"{timing.snapshot_s:.0f} s for its snapshot + {timing.fence_s:.0f} s at the fence before the next update, "
        f"where the {timing.write_s:.0f} s write has overlapped the next step's rollout, weight switch, reward and "
        f"reference ({vendor.before_update_s:.0f} s, {VENDOR_SOURCE}; no wait from "
        f"{hidden_bandwidth(step, vendor.before_update_s) / 1e9:.1f} GB/s), against {fg} in the foreground, at "
        f"{assumed}; the write holds up to {human_bytes(held)} of host memory on the busiest node (ranks "
        f"{node * layout.ranks_per_node}-{(node + 1) * layout.ranks_per_node - 1}) beside the {human_bytes(steady)} "
        "its offloaded weights and optimizer state take there"
    )
    mem = host_memory_bytes() if ctx.host.is_npu else None
    if not mem:
        return note, True
    if held + steady <= HOST_MEMORY_SHARE * mem:
        return note + f" (this node has {human_bytes(mem)})", True
    return (
        note + f": together {human_bytes(held + steady)}, more than {HOST_MEMORY_SHARE:.0%} of this node's "
        f"{human_bytes(mem)}; set {ASYNC_KEY}=False (a save in the foreground holds no copy) or offload less",
        False,
    )


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` is on (`base.mount_table`: the kernel's escapes decoded), None if
    unknown."""
    return mount_table.filesystem_type(path)


def _write_problem(folder: Path) -> str | None:
    probe = folder / f".verl_patches-preflight-{secrets.token_hex(8)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return f"{type(err).__name__}: {err.strerror or err}"
    return None


def storage_findings(ctx: Context, model: Mapping[str, Any], folder: Path) -> list[Finding]:
    """The folder on this host: exists, writable by the job, permissions the save accepts, room, filesystem."""

    check = "checkpoint.storage"
    if not folder.is_dir():
        if not ctx.cluster_profile:
            return [Finding(check, OK, f"{folder} does not exist yet: the first save creates it")]
        if not ctx.authoritative:
            return [
                Finding(
                    check,
                    NOT_CHECKED,
                    f"{folder} is not on this host (it lives on the cluster's storage): writable, room and the same "
                    f"storage on every node are checked by the launch on the nodes",
                    CKPT_SETTING,
                )
            ]
        return [
            Finding(
                check,
                FAIL,
                f"{folder} does not exist on this node: create it on the shared storage (mkdir -p -m 700 {folder}); "
                f"the launch never creates it, so that a node whose mount is missing cannot write a local folder "
                f"of that name",
                CKPT_SETTING,
            )
        ]
    out: list[Finding] = []
    notes: list[str] = []
    try:
        verdict = root_verdict(folder, cluster=ctx.cluster_profile, allow_shared=allow_shared_root())
    except EnvError as err:
        out.append(Finding(check, FAIL, str(err), ALLOW_SHARED_ROOT_ENV))
    else:
        if verdict.refusal:
            out.append(Finding(check, FAIL, verdict.refusal, f"{CKPT_SETTING} / {ALLOW_SHARED_ROOT_ENV}"))
        elif verdict.warning:
            notes.append(verdict.warning)
    unwritable = _write_problem(folder)
    if unwritable:
        out.append(
            Finding(check, FAIL, f"{folder}: cannot create a file there from this host ({unwritable})", CKPT_SETTING)
        )
    need, what = checkpoint_room(ctx.cfg, model, folder)
    try:
        st = os.statvfs(folder)
        free = st.f_bavail * st.f_frsize
    except OSError as err:
        free = None
        out.append(Finding(check, FAIL, f"{folder}: statvfs failed ({err})", CKPT_SETTING))
    if free is not None and free < need:
        out.append(
            Finding(
                check,
                FAIL,
                f"{folder} has {human_bytes(free)} free, needs {human_bytes(need)} for {what}: "
                f"{keep_tradeoff(ctx.cfg, checkpoint_step(model).nbytes)}",
                f"{CKPT_SETTING} / {KEEP_KEY}",
            )
        )
    if out:
        return out
    fs = filesystem_type(folder)
    text = f"{folder}: writable from this host, {human_bytes(free or 0)} free >= {human_bytes(need)} needed for {what}"
    text += f"; filesystem {fs}" if fs else ""
    if ctx.cluster_profile and fs in NEVER_SHARED_FS_TYPES:
        return [
            Finding(
                check,
                FAIL,
                f"{folder} is on {fs}, this host's memory or container layer: no other node sees it and it does not "
                "outlive the node; name a folder on the cluster's shared storage",
                CKPT_SETTING,
            )
        ]
    if ctx.cluster_profile and fs in LOCAL_FS_TYPES:
        notes.append(
            f"{folder} is on a local filesystem ({fs}) of this host: other nodes see it only if this host exports "
            "it; the launch checks every node"
        )
    return [Finding(check, WARN if notes else OK, "; ".join([text, *notes]), CKPT_SETTING if notes else "")]


def nodes_finding(ctx: Context, folder: Path) -> Finding:
    nodes = "every node" if ctx.layout is None else f"all {ctx.layout.cluster.nodes} node(s)"
    return Finding(
        "checkpoint.nodes",
        NOT_CHECKED,
        f"{folder} is the same storage and writable on every node: checked by the launch on {nodes} "
        f"once they joined Ray, before the trainer starts (each node writes a marker that every other node must see)",
        CKPT_SETTING,
    )


def resume_finding(ctx: Context, folder: Path) -> Finding:
    """Which step a resume would take, read as the trainer reads it (`trainer_io.resume_dir`)."""

    check = "checkpoint.resume"
    mode = get(ctx.cfg, "trainer.resume_mode", "auto")
    if mode == "disable":
        return Finding(check, OK, "resume: disabled (trainer.resume_mode=disable): starts at step 1")
    if mode == "auto" and not folder.is_dir():
        if ctx.cluster_profile and not ctx.authoritative:
            return Finding(check, NOT_CHECKED, f"resume: {folder} is not on this host; read on the head", CKPT_SETTING)
        return Finding(check, OK, f"resume: none: starts at step 1 ({folder} does not exist yet)")

    trainer = OmegaConf.create(
        {
            "default_local_dir": str(folder),
            "resume_mode": mode,
            "resume_from_path": get(ctx.cfg, "trainer.resume_from_path"),
            "default_hdfs_dir": get(ctx.cfg, "trainer.default_hdfs_dir"),
        }
    )
    try:
        # the root's permissions are the storage finding's to report (the same rule): no second line here
        path, note = resume_dir(trainer, cluster=ctx.cluster_profile, say=lambda line: None)
    except (CheckpointRootError, CheckpointIncomplete, ValueError, NotImplementedError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return Finding(check, FAIL, f"resume: {first}", "trainer.resume_mode / trainer.resume_from_path")
    # the root's tracker, read by the resume's own reader: a damaged one is named even when no step would use it
    damaged = read_root_tracker(folder)[1] if mode == "auto" else ""
    status, key = (WARN, f"{CKPT_SETTING} ({TRACKER_FILE})") if damaged else (OK, "")
    if damaged and damaged not in note:
        note = f"{note}; {damaged}" if note else damaged
    advice = f"; the resume does not read {TRACKER_FILE} as it is: repair it or remove it" if damaged else ""
    if path is None:
        return Finding(check, status, f"resume: none: starts at step 1 ({note}){advice}", key)

    step = parse_step_dir(path.name)
    tail = f"; {note}" if note else ""
    return Finding(
        check, status, f"resume: from {path} (step {step}{tail}): continues at step {(step or 0) + 1}{advice}", key
    )


__all__ = [
    "checkpoint_folder_findings",
    "checkpoint_room",
    "filesystem_type",
    "keep_count",
    "save_freq",
]
