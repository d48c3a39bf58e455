"""The git route: fetch the locked commit from the first mirror that has it, check the ref, export the folder.

Fetched objects are kept in a bare repository in the user cache, so a second setup needs no network.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from verl_patches.base import env_registry
from verl_patches.base.env_flags import EnvError
from verl_patches.sources import names
from verl_patches.sources.errors import IntegrityError, RouteUnavailable, SourceError
from verl_patches.sources.extract import confined_target
from verl_patches.sources.lock import Component

GIT_TIMEOUT_ENV = "VERL_OVERLAY_GIT_TIMEOUT"  # seconds per git command, default 600
# Transports git may use, whatever a URL says (ext:: and fd:: run commands); local paths are "file".
ALLOWED_PROTOCOLS = "https:http:ssh:git:file"


class BadGitArgument(IntegrityError):
    """A URL or ref that git could read as an option or a command-running transport."""


def git_timeout_s() -> float:
    try:
        return env_registry.number(GIT_TIMEOUT_ENV)
    except EnvError as err:
        raise SourceError(str(err)) from None


def checked_url(url: str) -> str:
    try:
        return names.git_url(url)
    except ValueError as e:
        raise BadGitArgument(f"git URL refused: {e}") from None


@dataclass(frozen=True)
class GitFetch:
    url: str  # the mirror that supplied the commit ("" when it was already in the cache)
    git_dir: Path
    attempts: tuple[str, ...]  # one line per mirror that failed, with the reason


def _git(
    args: list[str], git_dir: Path | None = None, timeout: float | None = None, input_bytes: bytes | None = None
) -> subprocess.CompletedProcess:
    timeout = git_timeout_s() if timeout is None else timeout
    cmd = ["git"] + (["--git-dir", str(git_dir)] if git_dir else []) + args
    env = dict(
        os.environ,
        GIT_TERMINAL_PROMPT="0",
        GIT_ASKPASS="true",
        LC_ALL="C",
        GIT_ALLOW_PROTOCOL=ALLOWED_PROTOCOLS,
        GIT_PROTOCOL_FROM_USER="0",
    )
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout, env=env, input=input_bytes)
    except FileNotFoundError:
        raise RouteUnavailable("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise RouteUnavailable(f"`{' '.join(cmd[:4])} …` timed out after {timeout:.0f} s") from None


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


def cache_git_dir(cache: Path, component: Component) -> Path:
    return cache / "git" / f"{names.plain_name(component.name)}.git"


def _ensure_bare(git_dir: Path) -> None:
    if not (git_dir / "HEAD").exists():
        git_dir.parent.mkdir(parents=True, exist_ok=True)
        proc = _git(["init", "-q", "--bare", str(git_dir)])
        if proc.returncode:
            raise RouteUnavailable(f"cannot create {git_dir}: {_last_line(proc)}")


def has_commit(git_dir: Path, commit: str) -> bool:
    if not (git_dir / "HEAD").exists():
        return False
    return _git(["cat-file", "-e", f"{commit}^{{commit}}"], git_dir).returncode == 0


def resolve_ref(url: str, ref: str) -> str | None:
    """The commit a remote ref points to (peeled for annotated tags), or None if the ref is absent."""
    checked_url(url)
    try:
        names.git_ref(ref)
    except ValueError as e:
        raise BadGitArgument(f"git ref refused: {e}") from None
    proc = _git(["ls-remote", url, ref, f"{ref}^{{}}"], timeout=min(git_timeout_s(), 120))
    if proc.returncode:
        raise RouteUnavailable(_last_line(proc))
    plain = peeled = None
    for line in proc.stdout.decode().splitlines():
        sha, _, name = line.partition("\t")
        if name == f"{ref}^{{}}":
            peeled = sha
        elif name == ref:
            plain = sha
    return peeled or plain


def fetch_commit(component: Component, cache: Path, urls: list[str], offline: bool = False) -> GitFetch:
    """Make `component.commit` present in the cache's bare repo, checking the ref on the mirror used."""
    git_dir = cache_git_dir(cache, component)
    if has_commit(git_dir, component.commit):
        return GitFetch("", git_dir, ())
    if offline:
        raise RouteUnavailable("commit not in the git cache and --offline was given")
    _ensure_bare(git_dir)
    attempts: list[str] = []
    for url in urls:
        checked_url(url)  # before anything reaches git: a refused URL is an error, not a mirror to skip
    for url in urls:
        try:
            found = resolve_ref(url, component.ref)
        except RouteUnavailable as e:
            attempts.append(f"{url}: unreachable ({e})")
            continue
        if found is None:
            attempts.append(f"{url}: has no ref {component.ref}")
            continue
        if found != component.commit:
            raise IntegrityError(
                f"{component.name}: {url} has {component.ref} at {found}, but the lock pins {component.commit} "
                f"(the ref moved, or the mirror is not the project it claims to be); refusing to use it"
            )
        proc = _git(["fetch", "-q", "--no-tags", "--depth=1", url, component.commit], git_dir)
        if proc.returncode:
            proc = _git(["fetch", "-q", "--no-tags", "--depth=1", url, f"+{component.ref}:{component.ref}"], git_dir)
        if proc.returncode:
            attempts.append(f"{url}: fetch failed ({_last_line(proc)})")
            continue
        if not has_commit(git_dir, component.commit):
            raise IntegrityError(f"{component.name}: {url} served {component.ref} without commit {component.commit}")
        return GitFetch(url, git_dir, tuple(attempts))
    raise RouteUnavailable("; ".join(attempts) or "no git URL configured")


def export_tree(git_dir: Path, commit: str, subdir: str, dest: Path) -> int:
    """Write the files under `subdir/` at `commit` into `dest` (modes and symlinks kept). Returns the count.

    Reads blobs directly instead of `git archive`, which would honour export-ignore attributes and so
    could drop files from the tree.
    """
    prefix = subdir.rstrip("/") + "/"
    proc = _git(["ls-tree", "-r", "-z", "--full-tree", commit, "--", prefix], git_dir)
    if proc.returncode:
        raise IntegrityError(f"cannot list {prefix} at {commit}: {_last_line(proc)}")
    entries = []
    for rec in proc.stdout.split(b"\0"):
        if not rec:
            continue
        meta, _, path = rec.partition(b"\t")
        mode, kind, sha = meta.decode().split()
        if kind != "blob":
            raise IntegrityError(f"{path.decode()}: a {kind} (submodule?) inside {prefix} is not supported")
        entries.append((mode, sha, path.decode()))
    if not entries:
        raise IntegrityError(f"no files under {prefix} at {commit}")
    batch = _git(["cat-file", "--batch"], git_dir, input_bytes="".join(f"{sha}\n" for _, sha, _ in entries).encode())
    if batch.returncode:
        raise IntegrityError(f"cannot read blobs at {commit}: {_last_line(batch)}")
    out, pos = batch.stdout, 0
    for mode, _sha, path in entries:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        data = out[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        target = confined_target(dest, path[len(prefix) :])
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            os.symlink(data.decode(), target)
        else:
            target.write_bytes(data)
            os.chmod(target, 0o755 if mode == "100755" else 0o644)
    return len(entries)


def read_blob(git_dir: Path, commit: str, path: str) -> bytes | None:
    proc = _git(["show", f"{commit}:{path}"], git_dir)
    return proc.stdout if proc.returncode == 0 else None
