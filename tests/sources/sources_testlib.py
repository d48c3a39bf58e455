"""Helpers for the sources tests: an isolated download cache, a tiny upstream project served from local
bare git repositories and from a local PEP 503 index, and temporary lock files that pin it.

Nothing here touches the real repo root's folders, its sources.lock or the user's download cache: every
test gets VERL_OVERLAY_CACHE pointing into its own tmp_path.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from verl_patches.base.free_port import free_port
from verl_patches.sources.paths import user_cache_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SH = REPO_ROOT / "setup_sources.sh"
PRELUDE_LINE = "from verl_patches import prelude_patch"
# The machine's real download cache, read before any test redirects VERL_OVERLAY_CACHE. Only the
# requirements tests read it (read-only), and they skip when it lacks what they need.
REAL_USER_CACHE = user_cache_dir()

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


# --------------------------------------------------------------------------- independent tree hash


def reference_tree_hash(root: Path) -> str:
    """The lock's tree hash, written independently of verl_patches.sources.treehash.

    sha256 over sorted "<mode> <sha256> <relpath>\\n" lines; mode is "x" (owner exec bit), "-" or "l"
    (symlink, hashed over its target text); __pycache__ folders and *.pyc/*.pyo files are ignored.
    """
    records = {}
    for dirpath, dirnames, filenames in os.walk(root):
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and d not in links]
        for name in filenames + links:
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            rel = Path(path).relative_to(root).as_posix()
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                records[rel] = "l " + hashlib.sha256(os.readlink(path).encode()).hexdigest()
            else:
                mode = "x" if st.st_mode & stat.S_IXUSR else "-"
                records[rel] = f"{mode} {hashlib.sha256(Path(path).read_bytes()).hexdigest()}"
    h = hashlib.sha256()
    for rel in sorted(records):
        h.update(f"{records[rel]} {rel}\n".encode())
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- tiny upstream content

MW_V1 = b'''# Copyright header comment
"""Workers module of the tiny upstream project.

Its docstring spans several lines so that a line-number based insertion would land inside it.
"""

import os
import sys


def work():
    return os.getpid(), sys.platform
'''

# file -> (content, executable); "link.txt" is a symlink (git route only: wheels cannot hold links)
V1_FILES: dict[str, tuple[bytes, bool]] = {
    "__init__.py": (b'"""alpha: a tiny upstream package."""\nVERSION = "1.0"\n', False),
    "workers/__init__.py": (b"", False),
    "workers/mw.py": (MW_V1, False),
    "bin/run.sh": (b"#!/bin/sh\necho run\n", True),
    "data/table.txt": (b"a,b\n1,2\n", False),
}
V1_LINKS = {"link.txt": "data/table.txt"}
V2_FILES = {**V1_FILES, "data/table.txt": (b"a,b\n1,3\n", False), "new.py": (b"X = 2\n", False)}


def write_tree(dest: Path, files: dict[str, tuple[bytes, bool]], links: dict[str, str] | None = None) -> Path:
    for rel, (data, executable) in files.items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.chmod(p, 0o755 if executable else 0o644)
    for rel, target in (links or {}).items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def git(*args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, env=GIT_ENV)
    if proc.returncode:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc.stdout.decode().strip()


@dataclass
class Upstream:
    """A bare repository holding package folder `alpha/` at two commits, with tags."""

    bare: Path
    work: Path
    v1: str  # commit of tags v1.0 (annotated) and v1.0-light (lightweight)
    v2: str  # a later commit changing one file and adding one, tagged v2.0
    git_hash_v1: str  # expected tree hash of alpha/ at v1 (computed from the files written, not by git)
    git_hash_v2: str

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def move_tag(self, tag: str, commit: str) -> None:
        git("tag", "-f", "-a", "-m", f"moved {tag}", tag, commit, cwd=self.work)
        git("push", "-q", "-f", str(self.bare), f"refs/tags/{tag}", cwd=self.work)


def make_upstream(base: Path) -> Upstream:
    work = base / "upstream-work"
    work.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=work)
    (work / "README.md").write_text("outside the package folder\n")
    write_tree(work / "alpha", V1_FILES, V1_LINKS)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "v1", cwd=work)
    v1 = git("rev-parse", "HEAD", cwd=work)
    git("tag", "-a", "-m", "release 1.0", "v1.0", cwd=work)
    git("tag", "v1.0-light", cwd=work)
    write_tree(work / "alpha", {k: V2_FILES[k] for k in ("data/table.txt", "new.py")})
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "v2", cwd=work)
    v2 = git("rev-parse", "HEAD", cwd=work)
    git("tag", "-a", "-m", "release 2.0", "v2.0", cwd=work)
    bare = base / "upstream.git"
    git("init", "-q", "--bare", str(bare))
    git("push", "-q", str(bare), "main", "--tags", cwd=work)
    h1 = reference_tree_hash(write_tree(base / "expect-v1", V1_FILES, V1_LINKS))
    h2 = reference_tree_hash(write_tree(base / "expect-v2", V2_FILES, V1_LINKS))
    return Upstream(bare, work, v1, v2, h1, h2)


# --------------------------------------------------------------------------- local PEP 503 index


def make_wheel(files: dict[str, tuple[bytes, bool]], package: str = "alpha", version: str = "1.0") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for rel, (data, executable) in sorted(files.items()):
            info = zipfile.ZipInfo(f"{package}/{rel}", date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            z.writestr(info, data)
        # fixed timestamps: the same files always give the same bytes (and sha256)
        z.writestr(
            zipfile.ZipInfo(f"{package}-{version}.dist-info/METADATA", date_time=(2020, 1, 1, 0, 0, 0)),
            f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n",
        )
    return buf.getvalue()


def make_sdist(files: dict[str, tuple[bytes, bool]], package: str = "alpha", version: str = "1.0") -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as t:
        for rel, (data, executable) in sorted(files.items()):
            info = tarfile.TarInfo(f"{package}-{version}/{package}/{rel}")
            info.size, info.mode, info.mtime = len(data), (0o755 if executable else 0o644), 1577836800
            t.addfile(info, io.BytesIO(data))
        pkg_info = f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode()
        info = tarfile.TarInfo(f"{package}-{version}/PKG-INFO")
        info.size, info.mtime = len(pkg_info), 1577836800
        t.addfile(info, io.BytesIO(pkg_info))
    return buf.getvalue()


WHEEL_FILE = "alpha-1.0-py3-none-any.whl"
SDIST_FILE = "alpha-1.0.tar.gz"


class LocalIndex:
    """A PEP 503 simple index on 127.0.0.1 serving files from a folder; records every request path."""

    def __init__(self, base: Path) -> None:
        self.base = base
        (base / "files").mkdir(parents=True, exist_ok=True)
        self.requests: list[str] = []
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(base), **kw)

            def log_message(self, *a):  # keep pytest output clean, remember what was asked
                index.requests.append(self.path)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def simple_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple"

    def file_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/files/{name}"

    def publish(self, project: str, name: str, data: bytes, listed_sha256: str | None = "auto") -> None:
        """Serve `data` as files/<name> and list it on simple/<project>/ (anchor sha256: given, auto, None)."""
        (self.base / "files" / name).write_bytes(data)
        page = self.base / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        anchors = page.read_text() if page.exists() else ""
        sha = sha256_bytes(data) if listed_sha256 == "auto" else listed_sha256
        frag = f"#sha256={sha}" if sha else ""
        lines = [ln for ln in anchors.splitlines() if f">{name}<" not in ln and ln.startswith("<a ")]
        lines.append(f'<a href="../../files/{name}{frag}">{name}</a><br/>')
        page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(lines) + "\n</body></html>\n")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def dead_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (connection refused at once)."""
    return f"http://127.0.0.1:{free_port()}/simple"


# --------------------------------------------------------------------------- lock files


def _toml_value(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v)


def write_lock(
    path: Path, components: dict[str, dict], prelude_file: str = "alpha/workers/mw.py", prelude_line: str = PRELUDE_LINE
) -> Path:
    """A lock in the committed lock's format; each component dict may hold `pypi` and `tree_sha256` tables."""
    out = [
        "# test lock",
        "schema = 1",
        "",
        "[prelude]",
        f"file = {_toml_value(prelude_file)}",
        f"line = {_toml_value(prelude_line)}",
        "",
    ]
    for name, comp in components.items():
        comp = dict(comp)
        pypi, hashes = comp.pop("pypi", None), comp.pop("tree_sha256", {})
        out.append(f"[components.{name}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in comp.items()]
        out.append("")
        if pypi:
            out.append(f"[components.{name}.pypi]")
            out += [f"{k} = {_toml_value(v)}" for k, v in pypi.items()]
            out.append("")
        out.append(f"[components.{name}.tree_sha256]")
        out += [f"{k} = {_toml_value(v)}" for k, v in hashes.items()]
        out.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))
    return path


def pypi_hash_v1() -> str:
    """Expected pypi tree hash of alpha 1.0: the v1 files without the symlink (wheels cannot hold one)."""
    with tempfile.TemporaryDirectory() as d:
        return reference_tree_hash(write_tree(Path(d) / "t", V1_FILES))


def alpha_component(
    up: Upstream | None,
    index: LocalIndex | None = None,
    *,
    artifact: str = WHEEL_FILE,
    artifact_bytes: bytes | None = None,
    url: str = "",
    git_urls: list[str] | None = None,
    ref: str = "refs/tags/v1.0",
    commit: str | None = None,
    needed_on=("cpu",),
    pypi_hash: str | None = None,
) -> dict:
    comp: dict = {
        "package": "alpha",
        "git_urls": git_urls if git_urls is not None else [up.url],
        "ref": ref,
        "commit": commit or up.v1,
        "git_subdir": "alpha",
        "needed_on": list(needed_on),
        "tree_sha256": {"git": up.git_hash_v1},
    }
    if index is not None or artifact_bytes is not None:
        data = (
            artifact_bytes
            if artifact_bytes is not None
            else (make_wheel(V1_FILES) if artifact.endswith(".whl") else make_sdist(V1_FILES))
        )
        subdir = "alpha" if artifact.endswith(".whl") else "alpha-1.0/alpha"
        comp["pypi"] = {
            "name": "alpha",
            "version": "1.0",
            "file": artifact,
            "sha256": sha256_bytes(data),
            "subdir": subdir,
            **({"url": url} if url else {}),
        }
        comp["tree_sha256"]["pypi"] = pypi_hash or pypi_hash_v1()
    return comp


def beta_component(index: LocalIndex, missing_git: Path) -> dict:
    """A second component, "beta", published on ``index`` as a wheel of the v1 files and reachable only there
    (its one git URL, ``missing_git``, does not exist)."""
    wheel = make_wheel(V1_FILES, package="beta")
    index.publish("beta", "beta-1.0-py3-none-any.whl", wheel)
    return {
        "package": "beta",
        "git_urls": [str(missing_git)],
        "ref": "refs/tags/v1.0",
        "commit": "b" * 40,
        "git_subdir": "beta",
        "needed_on": ["cpu"],
        "pypi": {
            "name": "beta",
            "version": "1.0",
            "file": "beta-1.0-py3-none-any.whl",
            "sha256": sha256_bytes(wheel),
            "subdir": "beta",
        },
        "tree_sha256": {"pypi": pypi_hash_v1()},
    }


# --------------------------------------------------------------------------- running setup


@dataclass
class Run:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run_setup(
    *args: str | Path, lock: Path | None = None, root: Path | None = None, env: dict | None = None, timeout: float = 120
) -> Run:
    cmd = ["bash", str(SETUP_SH)]
    if lock is not None:
        cmd += ["--lock", str(lock)]
    if root is not None:
        cmd += ["--root", str(root)]
    cmd += [str(a) for a in args]
    full_env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def snapshot(root: Path) -> dict[str, tuple]:
    """(inode, mtime_ns, ctime_ns, size, mode) of every path under root, the root itself included."""
    out = {".": tuple(os.lstat(root)[i] for i in (stat.ST_INO, stat.ST_MODE)) + (os.lstat(root).st_mtime_ns,)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode)
    return out


def copy_real_root(dest: Path, packages: list[str]) -> Path:
    """A temporary copy of the populated repo root: lock, manifests, state and the named package folders.

    Raises pytest's skip when a folder is absent (an unpopulated checkout).
    """
    missing = [p for p in packages if not (REPO_ROOT / p).is_dir()]
    if missing:
        pytest.skip(f"repo root not populated ({', '.join(missing)} absent): run setup_sources.sh first")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("sources.lock", ".sources_state.json"):
        if (REPO_ROOT / name).exists():
            shutil.copyfile(REPO_ROOT / name, dest / name)
    shutil.copytree(REPO_ROOT / "sources.manifests", dest / "sources.manifests")
    for p in packages:
        shutil.copytree(REPO_ROOT / p, dest / p, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def write_alpha_manifests(lock: Path) -> Path:
    """Per-file records of alpha 1.0 beside the lock (as committed for the real lock), so that verify and
    setup can name the files that differ."""
    from verl_patches.sources.manifests import save_manifest
    from verl_patches.sources.treehash import file_hashes

    with tempfile.TemporaryDirectory() as d:
        save_manifest(lock, "alpha", "git", file_hashes(write_tree(Path(d) / "git", V1_FILES, V1_LINKS)))
        save_manifest(lock, "alpha", "pypi", file_hashes(write_tree(Path(d) / "pypi", V1_FILES)))
    return lock


def alpha_lock(tmp_path: Path, upstream: Upstream, name: str = "sources.lock", extra: dict | None = None, **kw) -> Path:
    """A lock of alpha (`alpha_component(upstream, **kw)`) and the `extra` components, with alpha's per-file
    manifests beside it."""
    comps = {"alpha": alpha_component(upstream, **kw), **(extra or {})}
    return write_alpha_manifests(write_lock(tmp_path / "lock" / name, comps))


def pristine_hash(folder: Path, tmp_path: Path) -> str:
    """Tree hash of an installed folder with the prelude line taken out, by the independent definition."""
    from verl_patches.sources import prelude_line

    copy = tmp_path / "pristine-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy, symlinks=True)
    mw = copy / "workers/mw.py"
    mw.write_bytes(prelude_line.strip(mw.read_bytes(), PRELUDE_LINE))
    return reference_tree_hash(copy)
