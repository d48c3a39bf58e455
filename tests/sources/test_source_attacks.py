"""Attacks on the source overlay (issue 18): each one is performed, and must be refused with one clear
line, a non-zero exit, nothing touched outside the target folder and nothing half-written."""

from __future__ import annotations

import importlib.util
import io
import json
import marshal
import os
import py_compile
import sys
import tarfile
import tracemalloc

import pytest

from sources_testlib import (
    V1_FILES,
    alpha_component,
    alpha_lock,
    make_wheel,
    run_setup,
    sha256_bytes,
    write_lock,
)
from verl_patches.sources import extract
from verl_patches.sources.errors import IntegrityError
from verl_patches.sources.lock import LockError, load_lock


def _no_traceback(r):
    assert "Traceback" not in r.text, r.text


# --------------------------------------------------------------------------- 1. git arguments


def _injection(marker):
    return f"--upload-pack=touch {marker}"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_mirror_starting_with_dash_is_not_passed_to_git(tmp_path, upstream, how):
    marker = tmp_path / "pwned"
    lock = alpha_lock(tmp_path, upstream)
    if how == "flag":
        r = run_setup("--route", "git", "--mirror", f"alpha={_injection(marker)}", lock=lock, root=tmp_path / "root")
    else:
        r = run_setup(
            "--route",
            "git",
            lock=lock,
            root=tmp_path / "root",
            env={"VERL_OVERLAY_GIT_MIRROR_ALPHA": _injection(marker)},
        )
    assert r.rc == 2, r.text
    assert not marker.exists()
    assert (
        "starts with '-'" in r.err
        and ("--mirror alpha=" if how == "flag" else "VERL_OVERLAY_GIT_MIRROR_ALPHA") in r.err
    )
    assert not (tmp_path / "root" / "alpha").exists()
    _no_traceback(r)


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% {marker}",
        "ssh://-oProxyCommand=touch%20{marker}/x.git",
        "-oProxyCommand=touch {marker}:x.git",
        "fd::17",
        "file://otherhost/x.git",
        "relative/mirror.git",
    ],
    ids=["ext-transport", "ssh-host-option", "scp-host-option", "fd-transport", "file-remote-host", "relative"],
)
def test_command_running_transports_and_option_hosts_are_refused(tmp_path, upstream, url):
    marker = tmp_path / "pwned"
    r = run_setup(
        "--route",
        "git",
        "--mirror",
        "alpha=" + url.format(marker=marker),
        lock=alpha_lock(tmp_path, upstream),
        root=tmp_path / "root",
    )
    assert r.rc == 2, r.text
    assert not marker.exists()
    assert r.err.count("\n") == 1 and "--mirror alpha=" in r.err  # one line naming the value
    _no_traceback(r)


def test_lock_git_url_and_ref_injection_are_refused_naming_the_key(tmp_path, upstream):
    marker = tmp_path / "pwned"
    for key, value in (("git_urls", [_injection(marker)]), ("ref", _injection(marker))):
        lock = alpha_lock(tmp_path, upstream, **({"git_urls": value} if key == "git_urls" else {"ref": value}))
        r = run_setup("--route", "git", lock=lock, root=tmp_path / "root")
        assert r.rc == 2, r.text
        assert not marker.exists()
        assert f"components.alpha.{key}" in r.err and r.err.count("\n") == 1
        _no_traceback(r)


def test_local_path_and_file_url_mirrors_still_work(tmp_path, upstream):
    for i, url in enumerate((str(upstream.bare), upstream.url)):
        lock = alpha_lock(tmp_path, upstream, git_urls=[str(tmp_path / "no-such.git")])
        r = run_setup(
            "--route",
            "git",
            "--mirror",
            f"alpha={url}",
            lock=lock,
            root=tmp_path / f"root{i}",
            env={"VERL_OVERLAY_CACHE": str(tmp_path / f"cache{i}")},
        )
        assert r.rc == 0, r.text


# --------------------------------------------------------------------------- 3. lock values used as paths


def test_package_outside_the_root_is_refused_even_with_force(tmp_path, upstream):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    root = tmp_path / "root"
    for package in ("../victim", str(victim)):
        comp = alpha_component(upstream)
        comp["package"] = package
        lock = write_lock(tmp_path / "lock" / "sources.lock", {"alpha": comp})
        r = run_setup("--route", "git", "--force", lock=lock, root=root)
        assert r.rc == 2, r.text
        assert "components.alpha.package" in r.err and repr(package) in r.err
        assert (victim / "precious.txt").read_text() == "keep me\n" and sorted(os.listdir(victim)) == ["precious.txt"]
        _no_traceback(r)


def test_package_naming_our_own_folder_is_refused(tmp_path, upstream):
    comp = alpha_component(upstream)
    comp["package"] = "verl_patches"
    lock = write_lock(tmp_path / "lock" / "sources.lock", {"alpha": comp})
    r = run_setup("--route", "git", "--force", lock=lock, root=tmp_path / "root")
    assert r.rc == 2 and "components.alpha.package" in r.err and "'verl_patches'" in r.err, r.text


def test_a_file_where_the_package_folder_goes_is_never_replaced(tmp_path, upstream):
    root = tmp_path / "root"
    root.mkdir()
    (root / "alpha").write_text("a file the user keeps\n")
    r = run_setup("--route", "git", "--force", lock=alpha_lock(tmp_path, upstream), root=root)
    assert r.rc == 1, r.text
    assert "exists and is not a folder" in r.text
    assert (root / "alpha").read_text() == "a file the user keeps\n"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".sources_state")) == ["alpha"]
    _no_traceback(r)


def test_pypi_file_with_dotdot_cannot_delete_a_file_outside_the_cache(tmp_path, upstream, isolated_env):
    victim = tmp_path / "victim.whl"
    victim.write_bytes(b"not the artifact\n")
    comp = alpha_component(upstream, artifact_bytes=make_wheel(V1_FILES))
    rel = os.path.relpath(victim, isolated_env / "pypi")
    comp["pypi"]["file"] = rel
    lock = write_lock(tmp_path / "lock" / "sources.lock", {"alpha": comp})
    r = run_setup("--route", "pypi", "--offline", lock=lock, root=tmp_path / "root")
    assert r.rc == 2, r.text
    assert victim.read_bytes() == b"not the artifact\n"
    assert "components.alpha.pypi.file" in r.err
    _no_traceback(r)


@pytest.mark.parametrize(
    "key,value",
    [
        ("name", "../../evil"),
        ("git_subdir", "../alpha"),
        ("git_subdir", "/etc"),
        ("pypi.subdir", "alpha/../.."),
        ("prelude", "../outside.py"),
        ("pypi.url", "ftp://example.invalid/x.whl"),
        ("needed_on", "cpu"),
    ],
)
def test_lock_values_outside_the_allow_lists_are_refused_naming_the_key(tmp_path, upstream, key, value):
    comp = alpha_component(upstream, artifact_bytes=make_wheel(V1_FILES))
    name, prelude = "alpha", "alpha/workers/mw.py"
    if key == "name":
        name = json.dumps(value)  # a quoted TOML key
    elif key == "prelude":
        prelude = value
    elif key.startswith("pypi."):
        comp["pypi"][key.split(".")[1]] = value
    else:
        comp[key] = value
    lock = write_lock(tmp_path / "lock" / "sources.lock", {name: comp}, prelude_file=prelude)
    with pytest.raises(LockError) as e:
        load_lock(lock)
    assert "\n" not in str(e.value) and repr(value) in str(e.value) or key == "needed_on"
    r = run_setup("--route", "git", lock=lock, root=tmp_path / "root")
    assert r.rc == 2 and "sources.lock" in r.err, r.text
    assert not (tmp_path / "evil.git").exists() and not (tmp_path / "root").exists()
    _no_traceback(r)


# --------------------------------------------------------------------------- 4. cache folders


@pytest.fixture
def exported(tmp_path, upstream):
    lock = alpha_lock(tmp_path, upstream)
    cache_dir = tmp_path / "export"
    r = run_setup("--export-cache", cache_dir, "--route", "git", lock=lock, root=tmp_path / "unused")
    assert r.rc == 0, r.text
    return lock, cache_dir


def _offline(lock, cache_dir, tmp_path, env=None):
    return run_setup(
        "--route",
        "cache",
        "--cache",
        cache_dir,
        "--offline",
        lock=lock,
        root=tmp_path / "airgapped",
        env={"VERL_OVERLAY_CACHE": str(tmp_path / "fresh"), **(env or {})},
    )


def _edit_index(cache_dir, edit):
    p = cache_dir / "sources-cache.json"
    data = json.loads(p.read_text())
    data = edit(data)
    p.write_text(json.dumps(data))


def _bomb_tar(path, prefix, size):
    """A gzip tar with one file of `size` zero bytes under `prefix/` (a few kB compressed per 10 MB)."""

    class Zeros(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo(f"{prefix}/__init__.py")
        info.size = size
        t.addfile(info, io.BufferedReader(Zeros(size)))


def test_tar_bomb_is_capped_while_extracting(exported, tmp_path):
    lock, cache_dir = exported
    entry = json.loads((cache_dir / "sources-cache.json").read_text())["components"]["alpha"]
    tar_path = cache_dir / entry["file"]
    _bomb_tar(tar_path, "alpha", 8 << 20)
    _edit_index(
        cache_dir, lambda d: (d["components"]["alpha"].update(sha256=sha256_bytes(tar_path.read_bytes())), d)[1]
    )
    r = _offline(lock, cache_dir, tmp_path, env={"VERL_OVERLAY_MAX_FILE_BYTES": str(1 << 20)})
    assert r.rc == 1, r.text
    assert "alpha/__init__.py" in r.text and "VERL_OVERLAY_MAX_FILE_BYTES" in r.text
    assert not (tmp_path / "airgapped" / "alpha").exists()
    assert not (tmp_path / "airgapped" / ".sources_build").exists()  # nothing half-written left behind
    _no_traceback(r)


def test_extraction_streams_members_instead_of_reading_them_whole(tmp_path):
    archive = tmp_path / "big.tar.gz"
    _bomb_tar(archive, "pkg", 48 << 20)
    tracemalloc.start()
    try:
        extract.extract_subdir(archive, "pkg", tmp_path / "out")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (tmp_path / "out" / "__init__.py").stat().st_size == 48 << 20
    assert peak < 8 << 20, f"peak Python allocation {peak / 2**20:.1f} MiB for a 48 MiB member"


def test_total_size_and_member_count_are_capped(tmp_path, monkeypatch):
    archive = tmp_path / "many.tar"
    with tarfile.open(archive, "w") as t:
        for i in range(50):
            info = tarfile.TarInfo(f"pkg/f{i}.py")
            info.size = 1000
            t.addfile(info, io.BytesIO(b"x" * 1000))
    monkeypatch.setenv("VERL_OVERLAY_MAX_TREE_BYTES", "20000")
    with pytest.raises(IntegrityError, match="VERL_OVERLAY_MAX_TREE_BYTES"):
        extract.extract_subdir(archive, "pkg", tmp_path / "out1")
    monkeypatch.delenv("VERL_OVERLAY_MAX_TREE_BYTES")
    monkeypatch.setenv("VERL_OVERLAY_MAX_MEMBERS", "10")
    with pytest.raises(IntegrityError, match="VERL_OVERLAY_MAX_MEMBERS"):
        extract.extract_subdir(archive, "pkg", tmp_path / "out2")


def test_archive_members_cannot_leave_the_folder_through_a_symlink(tmp_path):
    archive = tmp_path / "evil.tar"
    outside = tmp_path / "outside"
    outside.mkdir()
    with tarfile.open(archive, "w") as t:
        link = tarfile.TarInfo("pkg/link")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        t.addfile(link)
        info = tarfile.TarInfo("pkg/link/planted.py")
        info.size = 3
        t.addfile(info, io.BytesIO(b"x=1"))
    with pytest.raises(IntegrityError, match="escapes"):
        extract.extract_subdir(archive, "pkg", tmp_path / "out")
    assert not (outside / "planted.py").exists()


def test_recorded_sha256_is_checked_before_extraction(exported, tmp_path):
    lock, cache_dir = exported
    _edit_index(cache_dir, lambda d: (d["components"]["alpha"].update(sha256="0" * 64), d)[1])
    r = _offline(lock, cache_dir, tmp_path)
    assert r.rc == 1 and "sha256" in r.text and "sources-cache.json" in r.text, r.text
    assert "unpacking" not in r.err
    assert not (tmp_path / "airgapped" / "alpha").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("file", ["/etc/hostname", "../outside.tar", "zero-link"])
def test_cache_file_outside_the_cache_or_not_regular_is_refused(exported, tmp_path, file):
    lock, cache_dir = exported
    (tmp_path / "outside.tar").write_bytes(b"")
    if file == "zero-link":
        os.symlink("/dev/zero", cache_dir / "zero-link")
    _edit_index(cache_dir, lambda d: (d["components"]["alpha"].update(file=file), d)[1])
    r = _offline(lock, cache_dir, tmp_path)
    assert r.rc == 1, r.text
    assert "components.alpha.file" in r.text and repr(file) in r.text
    assert not (tmp_path / "airgapped" / "alpha").exists()
    _no_traceback(r)


@pytest.mark.parametrize(
    "index",
    [
        [1, 2],
        {"schema": 1, "components": []},
        {"schema": 1, "components": {"alpha": "x"}},
        {"schema": 1, "components": {"alpha": {"route": "git"}}},
        {"schema": 1, "components": {"alpha": {"route": "git", "file": 7, "sha256": "0" * 64}}},
        {"schema": 1, "components": {"alpha": {"route": "git", "file": "a.tar", "sha256": "0" * 64, "commit": None}}},
    ],
    ids=["list", "components-list", "entry-string", "missing-file", "file-int", "commit-null"],
)
def test_malformed_cache_index_is_one_line_not_a_traceback(exported, tmp_path, index):
    lock, cache_dir = exported
    (cache_dir / "sources-cache.json").write_text(json.dumps(index))
    r = _offline(lock, cache_dir, tmp_path)
    assert r.rc == 1, r.text
    assert "sources-cache.json" in r.text
    _no_traceback(r)


# --------------------------------------------------------------------------- 2. byte-code

PLANTED = b'import os\nos.system("touch planted")\n'


def _plant_pyc(source_path, code_text: bytes, name: str | None = None):
    """A .pyc for `source_path` carrying `code_text`, its header made to match the source's mtime and size,
    so that Python imports it instead of the source."""
    st = os.stat(source_path)
    code = compile(code_text, str(source_path), "exec")
    header = (
        importlib.util.MAGIC_NUMBER
        + (0).to_bytes(4, "little")
        + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
        + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    )
    cache = source_path.parent / "__pycache__"
    cache.mkdir(exist_ok=True)
    pyc = cache / (name or f"{source_path.stem}.{sys.implementation.cache_tag}.pyc")
    pyc.write_bytes(header + marshal.dumps(code))
    return pyc


def test_planted_pyc_matching_the_source_header_fails_verify(installed, tmp_path):
    lock, root = installed
    init = root / "alpha" / "__init__.py"
    pyc = _plant_pyc(init, PLANTED)
    # the attack is real: this interpreter would run the planted code on import
    spec = importlib.util.spec_from_file_location("alpha", init)
    assert spec.loader.get_code("alpha").co_names[:2] == ("os", "system")
    r = run_setup("--verify", lock=lock, root=root)
    assert r.rc == 1, r.text
    assert f"byte-code: alpha/__pycache__/{pyc.name}: its code differs from its source" in r.out
    # and setup does not take the folder as pristine either (kept without --force, like any local edit)
    r = run_setup("--route", "git", lock=lock, root=root)
    assert r.rc == 1 and "byte-code" in r.text and pyc.exists()


def test_honest_byte_code_passes_verify_and_foreign_or_sourceless_byte_code_fails(installed, tmp_path):
    lock, root = installed
    for src in ("__init__.py", "workers/mw.py"):
        py_compile.compile(str(root / "alpha" / src), doraise=True)
    py_compile.compile(str(root / "alpha" / "__init__.py"), optimize=2, doraise=True)
    r = run_setup("--verify", lock=lock, root=root)
    assert r.rc == 0, r.text
    r = run_setup("--verify", lock=lock, root=root)  # warm: proofs come from the cache
    assert r.rc == 0, r.text

    sourceless = root / "alpha" / "gone.pyc"
    sourceless.write_bytes((root / "alpha" / "__pycache__").glob("*.pyc").__next__().read_bytes())
    foreign = root / "alpha" / "__pycache__" / "__init__.cpython-39.pyc"
    foreign.write_bytes(b"\x00" * 32)
    orphan = _plant_pyc(root / "alpha" / "__init__.py", PLANTED, name=f"deleted.{sys.implementation.cache_tag}.pyc")
    r = run_setup("--verify", lock=lock, root=root)
    assert r.rc == 1
    assert "byte-code: alpha/gone.pyc: byte-code outside __pycache__" in r.out
    assert "byte-code: alpha/__pycache__/__init__.cpython-39.pyc: byte-code of cpython-39" in r.out
    assert f"byte-code: alpha/__pycache__/{orphan.name}: byte-code without a source file" in r.out


# --------------------------------------------------------------------------- attacks of our own, same classes


def test_deeply_nested_lock_is_one_line(tmp_path):
    lock = tmp_path / "sources.lock"
    lock.write_text("schema = 1\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")
    r = run_setup("--verify", lock=lock, root=tmp_path / "root")
    assert r.rc == 2 and "nested too deeply" in r.err, r.text
    _no_traceback(r)


def test_index_page_cannot_send_an_http_install_to_a_local_file(tmp_path, upstream, index):
    outside = tmp_path / "outside.whl"
    outside.write_bytes(make_wheel(V1_FILES))
    comp = alpha_component(upstream, index)
    page = index.base / "simple" / "alpha" / "index.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(
        f'<a href="file://{outside}#sha256={comp["pypi"]["sha256"]}">{comp["pypi"]["file"]}</a>\n'.replace(
            str(outside), str(outside.with_name(comp["pypi"]["file"]))
        )
    )
    outside.rename(outside.with_name(comp["pypi"]["file"]))
    lock = write_lock(tmp_path / "lock" / "sources.lock", {"alpha": comp})
    r = run_setup("--route", "pypi", "--index-url", index.simple_url, lock=lock, root=tmp_path / "root")
    assert r.rc == 1 and "scheme 'file' refused" in r.text, r.text
    assert not (tmp_path / "root" / "alpha").exists()


@pytest.mark.parametrize("member", ["alpha//etc/planted.py", "alpha/../planted.py", "alpha/x/../../../planted.py"])
def test_zip_members_cannot_leave_the_folder(tmp_path, member):
    import zipfile

    archive = tmp_path / "evil.whl"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("alpha/__init__.py", "x = 1\n")
        z.writestr(member, "planted = 1\n")
    out = tmp_path / "deep" / "out"
    with pytest.raises(IntegrityError, match="escapes"):
        extract.extract_subdir(archive, "alpha", out)
    assert not list(tmp_path.rglob("planted.py"))


def test_zip_member_declaring_a_huge_size_is_refused_before_reading(tmp_path, monkeypatch):
    import zipfile

    archive = tmp_path / "big.whl"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("alpha/__init__.py", b"\0" * (4 << 20))
    monkeypatch.setenv("VERL_OVERLAY_MAX_FILE_BYTES", str(1 << 20))
    with pytest.raises(IntegrityError, match="declares 4194304 bytes"):
        extract.extract_subdir(archive, "alpha", tmp_path / "out")
    assert not (tmp_path / "out" / "__init__.py").exists()


def test_unchecked_hash_pyc_and_a_symlinked_pycache_fail_verify(installed, tmp_path):
    lock, root = installed
    init = root / "alpha" / "__init__.py"
    evil = tmp_path / "evil.py"
    evil.write_bytes(PLANTED)
    cache = root / "alpha" / "__pycache__"
    py_compile.compile(
        str(evil),
        cfile=str(cache / f"__init__.{sys.implementation.cache_tag}.pyc"),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    r = run_setup("--verify", lock=lock, root=root)
    assert r.rc == 1 and "__init__" in r.out and "its code differs from its source" in r.out, r.text
    import shutil

    shutil.rmtree(cache)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, cache)
    r = run_setup("--verify", lock=lock, root=root)
    assert r.rc == 1 and "added: alpha/__pycache__" in r.out, r.text
    assert init.exists()
