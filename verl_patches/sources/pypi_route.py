"""The PyPI route: download the exact artifact the lock names, check its sha256, never build anything.

The index is the one pip would use (flag, PIP_INDEX_URL, pip's config, else pypi.org), so clusters
behind a PyPI mirror work without extra settings. Artifacts are kept in the user cache.
"""

from __future__ import annotations

import hashlib
import html.parser
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from verl_patches.base import env_registry
from verl_patches.base.atomic_write import atomic_open, copy_file_atomically
from verl_patches.base.env_flags import EnvError
from verl_patches.sources import names
from verl_patches.sources.errors import IntegrityError, RouteUnavailable, SourceError
from verl_patches.sources.lock import PypiArtifact

DEFAULT_INDEX = "https://pypi.org/simple"
HTTP_TIMEOUT_ENV = "VERL_OVERLAY_HTTP_TIMEOUT"  # seconds per request, default 60


def http_timeout_s() -> float:
    try:
        return env_registry.number(HTTP_TIMEOUT_ENV)
    except EnvError as err:
        raise SourceError(str(err)) from None


def configured_index_url(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    if env_registry.text("PIP_INDEX_URL"):
        return env_registry.text("PIP_INDEX_URL")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return DEFAULT_INDEX


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_on_index(index_url: str, artifact: PypiArtifact) -> tuple[str, str | None]:
    """(download URL, sha256 from the index or None) of the artifact's exact file name."""
    page = f"{index_url.rstrip('/')}/{_normalize(artifact.name)}/"
    try:
        with urllib.request.urlopen(page, timeout=http_timeout_s()) as r:
            body = r.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as e:
        raise RouteUnavailable(f"index {page} unreachable: {getattr(e, 'reason', e)}") from None
    parser = _Links()
    parser.feed(body)
    for href in parser.hrefs:
        url, _, frag = href.partition("#")
        if urllib.parse.unquote(url.rsplit("/", 1)[-1]) == artifact.file:
            sha = frag[len("sha256=") :] if frag.startswith("sha256=") else None
            full = urllib.parse.urljoin(page, url)
            scheme = urllib.parse.urlsplit(full).scheme.lower()
            # an index page may only send us to the web, or to local files when it is local itself
            if scheme not in ("http", "https") and not (scheme == "file" and page.startswith("file:")):
                raise IntegrityError(f"index {page} lists {artifact.file} at {full!r}: scheme {scheme!r} refused")
            return full, sha
    raise RouteUnavailable(f"index {page} does not list {artifact.file}")


def _download(url: str, target: Path, label: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=http_timeout_s()) as r, atomic_open(target, "wb") as f:
            total = int(r.headers.get("Content-Length") or 0)
            done, next_report = 0, 0.0
            while block := r.read(1 << 20):
                f.write(block)
                done += len(block)
                if total and done / total >= next_report:
                    print(f"  {label}: {done / 1e6:.1f}/{total / 1e6:.1f} MB", file=sys.stderr)
                    next_report += 0.25
    except (urllib.error.URLError, OSError) as e:
        raise RouteUnavailable(f"download of {url} failed: {getattr(e, 'reason', e)}") from None


def cached_artifact(cache: Path, artifact: PypiArtifact) -> Path:
    return cache / "pypi" / names.artifact_file(artifact.file)


def fetch_artifact(
    artifact: PypiArtifact, cache: Path, index_url: str | None = None, offline: bool = False
) -> tuple[Path, str]:
    """Path of the verified artifact in the cache and where it came from ("cache" or a URL)."""
    if not artifact.sha256:
        raise IntegrityError(f"{artifact.file}: the lock has no sha256 for it; run setup_sources.sh --relock")
    target = cached_artifact(cache, artifact)
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise IntegrityError(f"{target}: not a regular file; remove it from the download cache")
    if target.exists():
        if sha256_file(target) == artifact.sha256:
            return target, "cache"
        target.unlink()  # a corrupt or foreign file in our own cache folder: fetch again, never trust it
    if offline:
        raise RouteUnavailable(f"{artifact.file} not in the cache and --offline was given")
    target.parent.mkdir(parents=True, exist_ok=True)
    index = configured_index_url(index_url)
    try:
        url, index_sha = find_on_index(index, artifact)
    except RouteUnavailable as first:
        if not artifact.url:
            raise
        url, index_sha = artifact.url, None
        print(f"  {artifact.file}: {first}; trying the lock's direct URL", file=sys.stderr)
    if index_sha and index_sha != artifact.sha256:
        raise IntegrityError(f"{artifact.file}: the index lists sha256 {index_sha}, the lock pins {artifact.sha256}")
    _download(url, target, artifact.file)
    found = sha256_file(target)
    if found != artifact.sha256:
        target.unlink()
        raise IntegrityError(f"{artifact.file}: downloaded sha256 {found} differs from the lock's {artifact.sha256}")
    return target, url


def copy_into(src: Path, dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / src.name
    copy_file_atomically(src, dest)
    return dest
