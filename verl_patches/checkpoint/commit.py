"""The filesystem side of a step checkpoint: staging folder, commit by rename, tracker, pruning, resume lookup.

A save writes into ``.staging-global_step_N``; `commit_step` checks every rank's record, writes the step
manifest last (each file's size and sha256) and renames the folder to ``global_step_N`` (one ``rename``:
the checkpoint is there complete or not at all), then updates verl's tracker file.

Ownership and identity (`run_identity`): the first save in a checkpoint root writes the run's secret,
``<root>/.verl_patches_run_secret`` (0600, this account's). Every step manifest is signed with it, and a step
is read back (resumed, exported) only if its signature verifies with the secret of the root that holds it, so a
step copied in by another account, or resealed after an edit, is refused by name. Every staging folder appears
by rename already holding a marker derived from the secret (0600: others cannot read it to copy it), and
folders being deleted are renamed to ``.trash-<tag>.<random>.<name>``. Pruning and the replacement of a
leftover only ever touch real folders (never symbolic links) that carry this root's marker: another tool's
``.staging-*``/``.trash-*`` folder, a checkpoint copied in from another run and a link are left alone, and a
trash folder is deleted where it is, never renamed again. Who may change the root itself is
`root_access`'s rule; the folders a save creates are never writable by group or others.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import fsync_dir, rename_durably, write_text_atomically
from verl_patches.base.regular_file import FileRefused, read_regular_file
from verl_patches.checkpoint.confine import ConfinementError, confined_path, is_real_dir
from verl_patches.checkpoint.manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    MAX_RANK_RECORD_BYTES,
    RANKS_DIR,
    CheckpointIncomplete,
    FileRecord,
    RankRecord,
    StepManifest,
    TrainLayout,
    check_rank_records,
    manifest_content,
    manifest_json,
    parse_manifest,
    parse_rank_record,
    rank_record_name,
    with_signature,
)
from verl_patches.checkpoint.plan import (
    STAGING_PREFIX,
    TRACKER_FILE,
    TRASH_PREFIX,
    Entry,
    ResumePoint,
    choose_resume,
    parse_step_dir,
    plan_prune,
    staging_dir_name,
    step_dir_name,
)
from verl_patches.checkpoint.root_access import CheckpointRootError, check_root_access
from verl_patches.checkpoint.run_identity import (
    SECRET_FILE,
    FolderTags,
    RunSecretError,
    ensure_run_secret,
    mac_matches,
    manifest_mac,
    read_run_secret,
)
from verl_patches.checkpoint.safe_load import UnsafeCheckpointError, check_digest, sha256_file
from verl_patches.checkpoint.tracker import TrackerError, read_tracker

SMALL_FILE_BYTES = 1 << 20  # the files a resume checks on the driver before choosing a step (records, RNG, trackers)
OWNER_FILE = ".verl_patches_owner"  # in each folder this root's saves create: the owner tag (`FolderTags`), 0600
_TAG_RE = re.compile(r"[0-9a-f]{32}")
_RANK_RECORD_RE = re.compile(r"rank_[0-9]{5,10}\.json")
FOLDER_MODE = 0o755  # what a save creates is never writable by group or others, whatever the umask
FILE_MODE = 0o644  # likewise the files the driver writes last (the manifest, the root's tracker)


def read_owner(folder: Path) -> str | None:
    """The tag in ``folder``'s owner marker, or None when it has no valid one (a link is never one)."""
    try:
        data = read_regular_file(Path(folder) / OWNER_FILE, max_bytes=128, follow_symlinks=False)
        text = data.decode("ascii").strip()
    except (FileRefused, UnicodeDecodeError):
        return None
    return text if _TAG_RE.fullmatch(text) else None


def root_tags(root: Path, create: bool) -> FolderTags | None:
    """The tags of ``root``'s saves (None when it has no run secret yet and ``create`` is false). A secret
    file that cannot be used is a `CheckpointRootError` naming it."""
    try:
        secret = ensure_run_secret(root) if create else read_run_secret(root)
    except RunSecretError as err:
        raise CheckpointRootError(str(err)) from None
    return FolderTags.of(secret) if secret is not None else None


def _is_ours(path: Path, tags: FolderTags | None) -> bool:
    return tags is not None and is_real_dir(path) and read_owner(path) == tags.owner


def _is_our_trash(path: Path, tags: FolderTags | None) -> bool:
    return tags is not None and path.name.startswith(f"{TRASH_PREFIX}{tags.trash}.") and is_real_dir(path)


def _remove_tree(path: Path, tags: FolderTags) -> None:
    """Rename one of our folders to a trash name first, then delete: an interrupted delete leaves only trash
    (of ours, so the next prune finishes it in place)."""
    trash = path.with_name(f"{TRASH_PREFIX}{tags.trash}.{uuid.uuid4().hex[:8]}.{path.name}"[:255])
    rename_durably(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _make_root(root: Path) -> None:
    """The root and its missing levels, created `FOLDER_MODE` (``mkdir -p`` would use the umask)."""
    missing = []
    level = root
    while not os.path.lexists(level) and level != level.parent:
        missing.append(level)
        level = level.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, FOLDER_MODE)
        except FileExistsError:
            pass


def begin_step(
    root: Path,
    step: int,
    *,
    cluster: bool = False,
    environ: Mapping[str, str] | None = None,
    say: Callable[[str], Any] = print,
) -> Path:
    """A fresh, empty staging folder for ``step``, carrying this root's owner marker (a leftover of an
    interrupted save of ours is removed; anything else of that name is refused). The root must pass
    `root_access.check_root_access` (``cluster``: the run is on a cluster profile)."""
    root = Path(root)
    _make_root(root)
    check_root_access(root, cluster=cluster, environ=environ, say=say)
    tags = root_tags(root, create=True)
    assert tags is not None
    staging = root / staging_dir_name(step)
    if os.path.lexists(staging):
        if not _is_ours(staging, tags):
            raise CheckpointRootError(
                f"{staging}: exists and was not created by this checkpoint root's saves "
                f"(no {OWNER_FILE} of {root}'s run); move it away to save step {step}"
            )
        _remove_tree(staging, tags)
    fresh = root / f"{TRASH_PREFIX}{tags.trash}.{uuid.uuid4().hex[:8]}.new"  # ours until the rename: pruned if we die
    os.mkdir(fresh, FOLDER_MODE)
    write_text_atomically(fresh / OWNER_FILE, tags.owner + "\n", mode=0o600)
    rename_durably(fresh, staging)
    return staging


def _signature_problem(step_dir: Path, manifest: StepManifest, where: str) -> str:
    """'' when ``manifest`` is signed with the run secret of the root holding ``step_dir``, else why not."""
    root = Path(os.path.abspath(step_dir)).parent
    try:
        secret = read_run_secret(root)
    except RunSecretError as err:
        return f"{where}: cannot be verified: {err}"
    if secret is None:
        return (
            f"{where}: cannot be verified: {root} has no run secret ({SECRET_FILE}); a step is resumed only in the "
            "checkpoint root whose run saved it"
        )
    if not mac_matches(secret, manifest.content, manifest.signature):
        return (
            f"{where}: its signature does not match the run secret of {root}: saved by another run or account "
            "and copied here, or changed after the save; refused"
        )
    return ""


def read_manifest(step_dir: Path) -> StepManifest:
    """The step manifest of a step folder that is a real folder (not a link), its signature verified with the
    run secret of the root that holds it (`run_identity`); CheckpointIncomplete naming the file and key, or why
    the signature fails, otherwise."""
    step_dir = Path(step_dir)
    path = step_dir / MANIFEST_FILE
    if os.path.islink(step_dir):
        raise CheckpointIncomplete(f"{step_dir}: is a symbolic link; a step folder is resumed only where it was saved")
    if not os.path.lexists(path):
        raise CheckpointIncomplete(f"{path}: missing (the save of this step did not finish)")
    try:
        data = read_regular_file(path, max_bytes=MAX_MANIFEST_BYTES, follow_symlinks=False)
    except FileRefused as err:
        raise CheckpointIncomplete(str(err)) from None
    manifest = parse_manifest(data, str(path))
    expected = parse_step_dir(step_dir.name)
    if expected is not None and manifest.step != expected:
        raise CheckpointIncomplete(f"{path}: says step {manifest.step}, the folder is step {expected}")
    unsigned = _signature_problem(step_dir, manifest, str(path))
    if unsigned:
        raise CheckpointIncomplete(unsigned)
    return manifest


def write_manifest(step_dir: Path, raw: Mapping[str, Any]) -> None:
    """Write ``raw`` (a `manifest_json`) as ``step_dir``'s manifest, signed with the run secret of the root that
    holds it (the save's last write before its rename; `CheckpointRootError` when that root has no usable
    secret)."""
    root = Path(os.path.abspath(step_dir)).parent
    try:
        secret = read_run_secret(root)
    except RunSecretError as err:
        raise CheckpointRootError(str(err)) from None
    if secret is None:
        raise CheckpointRootError(f"{root}: has no run secret ({SECRET_FILE}); a step is signed by begin_step's root")
    signature = manifest_mac(secret, manifest_content(raw))
    text = json.dumps(with_signature(raw, signature), indent=2) + "\n"
    write_text_atomically(Path(step_dir) / MANIFEST_FILE, text, mode=FILE_MODE)


def step_problem(step_dir: Path) -> str:
    """'' when the step folder is complete (valid manifest, every listed file a regular file inside it with
    its recorded size), else one line saying why not."""
    try:
        manifest = read_manifest(step_dir)
    except CheckpointIncomplete as err:
        return str(err)
    where = str(Path(step_dir) / MANIFEST_FILE)
    for rel, rec in manifest.files.items():
        try:
            p = confined_path(Path(step_dir), rel, where)
        except ConfinementError as err:
            return str(err)
        try:
            st = os.lstat(p)
        except OSError:
            return f"{p}: missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{p}: not a regular file"
        if st.st_size != rec.size:
            return f"{p}: {st.st_size} bytes, {MANIFEST_FILE} records {rec.size}"
    return ""


def is_complete(step_dir: Path) -> bool:
    return step_problem(step_dir) == ""


def listing(root: Path) -> dict[str, Entry]:
    """Folder name -> `Entry`, for step, staging and trash names under ``root`` (links included, never ours).
    A step folder is complete only when its manifest is signed with this root's run secret (`read_manifest`)."""
    out: dict[str, Entry] = {}
    root = Path(root)
    if not root.is_dir():
        return out
    try:
        tags = root_tags(root, create=False)
    except CheckpointRootError:
        tags = None  # nothing is ours; each step says why its signature cannot be checked
    for e in os.scandir(root):
        path, name = root / e.name, e.name
        link, folder = e.is_symlink(), e.is_dir(follow_symlinks=False)
        if parse_step_dir(name) is not None:
            if link:
                out[name] = Entry(
                    problem=f"{path}: is a symbolic link; a step folder is resumed only where it was saved"
                )
            elif not folder:
                out[name] = Entry(problem=f"{path}: not a folder")
            else:
                problem = step_problem(path)
                out[name] = Entry(complete=not problem, ours=_is_ours(path, tags), problem=problem)
        elif name.startswith(STAGING_PREFIX):
            out[name] = Entry(ours=not link and _is_ours(path, tags))
        elif name.startswith(TRASH_PREFIX):
            out[name] = Entry(ours=not link and _is_our_trash(path, tags))
    return out


def _files_under(folder: Path) -> dict[str, int]:
    """Every regular file under ``folder`` (relative name -> bytes); a link or special file is refused. What
    this account wrote there is made not writable by group or others (a rank's umask may have allowed it)."""
    out: dict[str, int] = {}
    uid = os.geteuid()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = os.lstat(p)
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise CheckpointIncomplete(
                    f"{p}: a symbolic link or special file in a save; a checkpoint holds regular files only"
                )
            if st.st_mode & 0o022 and st.st_uid == uid:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o022, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out[p.relative_to(folder).as_posix()] = st.st_size
    return dict(sorted(out.items()))


def read_rank_records(role_dir: Path, listed: Mapping[str, FileRecord] | None = None) -> list[RankRecord]:
    """The rank records of a role folder, each strictly parsed; CheckpointIncomplete naming the file.

    ``listed``: the role's files as the committed step's manifest records them (`StepManifest.role_files`).
    A resume reads exactly the records listed there, each checked against its recorded sha256, and never
    one that was added to the folder afterwards. Without it (the save's own check before the commit) the
    records are the ones the ranks wrote into the staging folder."""
    role_dir = Path(role_dir)
    try:
        ranks = confined_path(role_dir, RANKS_DIR, str(role_dir))
    except ConfinementError as err:
        raise CheckpointIncomplete(str(err)) from None
    if listed is None:
        if not is_real_dir(ranks):
            return []
        names = sorted(os.listdir(ranks))
    else:
        names = sorted(rel.partition("/")[2] for rel in listed if rel.partition("/")[0] == RANKS_DIR)
    out = []
    for name in names:
        if not _RANK_RECORD_RE.fullmatch(name):
            continue
        p = ranks / name
        try:
            data = read_regular_file(p, max_bytes=MAX_RANK_RECORD_BYTES, follow_symlinks=False)
        except FileRefused as err:
            raise CheckpointIncomplete(str(err)) from None
        if listed is not None:
            check_digest(p, hashlib.sha256(data).hexdigest(), listed[f"{RANKS_DIR}/{name}"].sha256)
        out.append(parse_rank_record(data, str(p)))
    return out


def role_layout(role_dir: Path) -> tuple[TrainLayout | None, list[RankRecord]]:
    """The layout every rank of a role saved at and the records, after checking its save is complete;
    (None, []) for a role whose checkpoint manager keeps no rank records (verl's FSDP manager)."""
    if not is_real_dir(role_dir / RANKS_DIR):
        return None, []
    records = read_rank_records(role_dir)
    sizes: dict[str, int | None] = {}
    for r in records:
        for n in r.files:
            try:
                p = confined_path(role_dir, n, str(role_dir / rank_record_name(r.rank)))
            except ConfinementError as err:
                raise CheckpointIncomplete(str(err)) from None
            st = os.lstat(p) if os.path.lexists(p) else None
            sizes[n] = st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None
    return check_rank_records(role_dir.name, records, sizes), records


def commit_step(root: Path, staging: Path, step: int, extra: Mapping[str, Any] | None = None) -> Path:
    """Check the staged save, write its manifest, rename it into place and update the tracker.

    Each file's sha256 comes from the rank that wrote it (hashed where it was written, in parallel);
    the files no rank recorded (the dataloader position, a role without rank records) are hashed here.
    """
    root, staging = Path(root), Path(staging)
    tags = root_tags(root, create=False)
    if not _is_ours(staging, tags):
        raise CheckpointRootError(
            f"{staging}: not a staging folder created by begin_step in {root} (no matching {OWNER_FILE})"
        )
    assert tags is not None
    roles: dict[str, TrainLayout | None] = {}
    digests: dict[str, str] = {}
    for p in sorted(staging.iterdir()):
        if is_real_dir(p):
            roles[p.name], records = role_layout(p)
            digests.update({f"{p.name}/{n}": h for r in records for n, h in r.sha256.items()})
    sizes = _files_under(staging)
    sizes.pop(MANIFEST_FILE, None)
    files = {rel: FileRecord(size, digests.get(rel) or sha256_file(staging / rel)) for rel, size in sizes.items()}
    write_manifest(staging, manifest_json(step, roles, files, extra))
    fsync_dir(staging)
    final = root / step_dir_name(step)
    if os.path.lexists(final):  # the same step saved again (a resumed run re-reaching it): the new save replaces it
        if not _is_ours(final, tags):
            raise CheckpointRootError(
                f"{final}: exists and was not saved by this checkpoint root's saves; move it away to save step {step}"
            )
        _remove_tree(final, tags)
    rename_durably(staging, final)
    write_text_atomically(root / TRACKER_FILE, str(step), mode=FILE_MODE)
    return final


def prune(root: Path, keep_last: int | None, protect: tuple[str, ...] = ()) -> list[str]:
    """Delete our checkpoints beyond the newest ``keep_last`` and our leftovers of interrupted saves; returns
    the names deleted. Folders not created by this root's saves are never touched."""
    root = Path(root)
    try:
        tags = root_tags(root, create=False)
    except CheckpointRootError:
        return []  # a secret that cannot be used: nothing can be shown to be ours
    if tags is None:
        return []
    plan = plan_prune(listing(root), keep_last, protect)
    for name in plan.delete:
        path = root / name
        if _is_our_trash(path, tags):
            shutil.rmtree(path, ignore_errors=True)  # in place: a trash name is never renamed again
        elif _is_ours(path, tags):
            _remove_tree(path, tags)
    return list(plan.delete)


def read_root_tracker(root: Path) -> tuple[int | None, str]:
    """(the root tracker's step or None, why it could not be read or '')."""
    tracker = Path(root) / TRACKER_FILE
    if not os.path.lexists(tracker):
        return None, ""
    try:
        return read_tracker(tracker), ""
    except TrackerError as err:
        return None, str(err)


def small_files_problem(step_dir: Path) -> str:
    """'' when every file of at most `SMALL_FILE_BYTES` has its recorded sha256 and every rank record parses,
    else one line naming the file. Cheap (small files only), so the driver can skip a damaged step before
    any worker reads it; the workers check the digests of the large files they read."""
    step_dir = Path(step_dir)
    try:
        manifest = read_manifest(step_dir)
        for rel, rec in manifest.files.items():
            if rec.size <= SMALL_FILE_BYTES:
                path = confined_path(step_dir, rel, str(step_dir / MANIFEST_FILE))
                check_digest(path, sha256_file(path), rec.sha256)
        for role, layout in manifest.roles.items():
            if layout is not None:
                read_rank_records(step_dir / role, manifest.role_files(role))
    except (CheckpointIncomplete, ConfinementError, FileRefused, UnsafeCheckpointError, OSError) as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return ""


def find_resume_and_why(
    root: Path,
    *,
    cluster: bool = False,
    environ: Mapping[str, str] | None = None,
    say: Callable[[str], Any] = print,
) -> tuple[ResumePoint | None, str]:
    """The newest complete step whose small files are intact (`small_files_problem`), or None, and one line:
    the point's note (a newer step skipped and why, a tracker that could not be used), or why there is none.
    The root must pass `root_access.check_root_access` (``cluster``: the run is on a cluster profile)."""
    root = Path(root)
    if root.is_dir():
        check_root_access(root, cluster=cluster, environ=environ, say=say)
    tracked, problem = read_root_tracker(root)
    entries = listing(root)
    while True:
        point = choose_resume(entries, tracked, problem)
        if point is None:
            broken = sorted(
                ((s, n) for n, e in entries.items() if (s := parse_step_dir(n)) is not None and not e.complete),
                reverse=True,
            )
            why = f"no complete checkpoint under {root}"
            return None, (
                f"{why}; {broken[0][1]} skipped: {entries[broken[0][1]].problem or 'incomplete'}" if broken else why
            )
        damaged = small_files_problem(root / point.name)
        if not damaged:
            return point, point.note
        entries[point.name] = Entry(complete=False, ours=entries[point.name].ours, problem=damaged)


def find_resume(root: Path, *, cluster: bool = False) -> ResumePoint | None:
    return find_resume_and_why(root, cluster=cluster)[0]
