"""The wheel cache (verl_patches/sources/wheel_cache.py) installs nothing whose sha256 is not the lock's.

A tiny package made here (`tinypkg`, one module) stands for a locked wheel; its tampered twin has the same file
name and adds a ``.pth`` that runs at every interpreter start and leaves a marker file. The installers run for
real (pip and the pinned uv, offline, from folders in tmp_path): our own check refuses the twin by name before
any installer sees it, the installers' ``--require-hashes`` refuse it on their own, and a twin installed by
hand afterwards is named by the receipt check (`pins check`)."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from verl_patches.sources import install_receipt, wheel_cache
from verl_patches.sources.wheel_lock import LockedFile, LockedPackage, WheelLock, hashed_requirements, host_platform

HOST = host_platform()
WHEEL = "tinypkg-1.0-py3-none-any.whl"


def make_wheel(folder: Path, *, startup_marker: Path | None = None, value: int = 1) -> Path:
    """tinypkg 1.0 as a wheel in ``folder``; with ``startup_marker`` the tampered twin: a .pth that writes it."""
    files = {"tinypkg/__init__.py": f"VALUE = {value}\n".encode()}
    if startup_marker is not None:
        files["tinypkg-startup.pth"] = (
            f"import pathlib; pathlib.Path({str(startup_marker)!r}).write_text('ran')\n".encode()
        )
    info = "tinypkg-1.0.dist-info"
    files[f"{info}/METADATA"] = b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / WHEEL
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_lock(good: Path, *extra: LockedPackage) -> WheelLock:
    package = LockedPackage("tinypkg", "1.0", "tinypkg==1.0", (HOST,), (LockedFile(WHEEL, sha256(good), (HOST,)),))
    return WheelLock({p.name: p for p in (package, *extra)})


def private_cache(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "user-cache"  # VERL_OVERLAY_CACHE (conftest)
    (root / "wheels").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    return root, root / "wheels"


def uv_binary() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("uv is not installed (requirements-test.txt pins it)")
    return found


# ---- our check, before any installer -----------------------------------------------------------------------------
def test_a_planted_wheel_with_a_locked_name_is_refused_by_name_before_any_installer_sees_it(tmp_path):
    good = make_wheel(tmp_path / "pypi")
    root, wheels = private_cache(tmp_path)
    make_wheel(wheels, startup_marker=tmp_path / "ran")
    fd, cache = wheel_cache.open_cache()
    dest = tmp_path / "dest"
    dest.mkdir()
    dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(wheel_cache.WheelCacheError) as err:
            wheel_cache.verify_into(fd, cache, dest_fd, tiny_lock(good), HOST)
    finally:
        os.close(fd)
        os.close(dest_fd)
    message = str(err.value)
    assert message.startswith(f"{cache / WHEEL}: sha256 {sha256(wheels / WHEEL)} is not the {sha256(good)} that ")
    assert "for tinypkg 1.0" in message and f"`rm {cache / WHEEL}`" in message and "\n" not in message
    assert list(dest.iterdir()) == []


def test_only_the_locked_files_that_check_out_reach_the_installers(tmp_path):
    good = make_wheel(tmp_path / "pypi")
    _, wheels = private_cache(tmp_path)
    shutil.copy(good, wheels / WHEEL)
    (wheels / "tinypkg-1.0-py3-none-manylinux_2_99_x86_64.whl").write_bytes(b"planted, under a name the lock lacks")
    (wheels / "tinypkg-0.9-py3-none-any.whl").write_bytes(b"an older file")
    fd, cache = wheel_cache.open_cache()
    dest = tmp_path / "dest"
    dest.mkdir()
    dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        staged = wheel_cache.verify_into(fd, cache, dest_fd, tiny_lock(good), HOST)
    finally:
        os.close(fd)
        os.close(dest_fd)
    assert staged == {"tinypkg": [sha256(good)]} and sorted(p.name for p in dest.iterdir()) == [WHEEL]
    assert os.path.samefile(dest / WHEEL, wheels / WHEEL)  # a hard link of the very file hashed


@pytest.mark.parametrize("level", ["root", "wheels"])
def test_a_wheel_cache_others_can_write_is_refused_by_name(tmp_path, level):
    root, wheels = private_cache(tmp_path)
    target = root if level == "root" else wheels
    target.chmod(0o777)
    with pytest.raises(wheel_cache.WheelCacheError) as err:
        wheel_cache.open_cache()
    message = str(err.value)
    assert message.startswith(f"{target}: is writable by group/others (mode 777); `chmod go-w {target}`")
    assert "VERL_OVERLAY_CACHE" in message


def test_a_wheel_cache_folder_of_another_account_is_refused(tmp_path, monkeypatch):
    root, _ = private_cache(tmp_path)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 4242)
    with pytest.raises(wheel_cache.WheelCacheError, match=f"user-cache: is owned by uid {real}, not by this account"):
        wheel_cache.open_cache()


def test_a_missing_wheel_cache_is_created_private(tmp_path):
    fd, cache = wheel_cache.open_cache()
    os.close(fd)
    assert cache == (tmp_path / "user-cache" / "wheels").resolve()
    assert [oct(p.stat().st_mode & 0o777) for p in (cache.parent, cache)] == ["0o700", "0o700"]


@pytest.mark.parametrize("plant", ["link", "writable"])
def test_a_link_or_a_file_others_can_write_in_the_cache_is_refused(tmp_path, plant):
    good = make_wheel(tmp_path / "pypi")
    _, wheels = private_cache(tmp_path)
    if plant == "link":
        (wheels / WHEEL).symlink_to(good)
        match = "cannot be opened without following links"
    else:
        shutil.copy(good, wheels / WHEEL)
        (wheels / WHEEL).chmod(0o666)
        match = r"is writable by group/others \(mode 666\); `chmod go-w "
    fd, cache = wheel_cache.open_cache()
    try:
        with pytest.raises(wheel_cache.WheelCacheError, match=match):
            wheel_cache.verify_into(fd, cache, fd, tiny_lock(good), HOST)
    finally:
        os.close(fd)


# ---- the installers' own hash checking ---------------------------------------------------------------------------
@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_the_installers_refuse_the_planted_wheel_on_their_own(tmp_path, installer):
    """The second line of defence, as setup_cpu_env.sh runs it: offline, from one folder, --require-hashes."""
    good = make_wheel(tmp_path / "pypi")
    folder = tmp_path / "links"
    marker = tmp_path / "ran"
    make_wheel(folder, startup_marker=marker)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(hashed_requirements(tiny_lock(good), HOST))

    def install(target: Path) -> subprocess.CompletedProcess:
        if installer == "uv":
            command = [uv_binary(), "pip", "install", "--no-config", "--no-cache", "--python", sys.executable]
        else:
            command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
        command += ["--require-hashes", "--no-index", "--find-links", str(folder), "--target", str(target)]
        return subprocess.run([*command, "-r", str(requirements)], capture_output=True, text=True, timeout=120)

    refused = install(tmp_path / "target")
    assert refused.returncode != 0 and "tinypkg" in refused.stderr
    assert ("hash mismatch" if installer == "uv" else "do not match the hashes") in refused.stderr.lower()
    assert not (tmp_path / "target" / "tinypkg-startup.pth").exists() and not marker.exists()
    shutil.copy(good, folder / WHEEL)  # the control: PyPI's file installs
    done = install(tmp_path / "target2")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "target2" / "tinypkg" / "__init__.py").read_text() == "VALUE = 1\n"


# ---- the whole install into an environment -----------------------------------------------------------------------
@pytest.fixture
def tiny_env(tmp_path, monkeypatch):
    """A fresh environment (pip borrowed from the base interpreter), a private cache holding the pinned uv wheel
    and PyPI's tinypkg, and the lock of just those two."""
    locked_uv = wheel_cache.read_lock().packages["uv"]
    uv_file = next(f for f in locked_uv.files_for(HOST))
    shared = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verl_overlay" / "wheels"
    if not (shared / uv_file.file).is_file():
        pytest.skip(f"the pinned uv wheel is not in {shared} (setup_cpu_env.sh puts it there)")
    _, wheels = private_cache(tmp_path)
    shutil.copy(shared / uv_file.file, wheels / uv_file.file)
    good = make_wheel(tmp_path / "pypi")
    shutil.copy(good, wheels / WHEEL)
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run(
        [str(base), "-m", "venv", "--without-pip", "--system-site-packages", str(tmp_path / "env")], check=True
    )
    lock = tiny_lock(good, locked_uv)
    monkeypatch.setattr(wheel_cache, "read_lock", lambda: lock)
    monkeypatch.setattr(
        wheel_cache, "check_fresh", lambda lock, expected: None
    )  # the real lock's freshness: test_wheel_lock
    env = wheel_cache.environment_of(tmp_path / "env" / "bin" / "python")
    return env, lock, good, wheels


def _problems(env, lock) -> list[str]:
    return install_receipt.problems(env.prefix, env.site_packages, lock, HOST)


@pytest.mark.timeout(300)  # a real pip and uv install into a fresh environment: 6 s here
def test_install_checks_every_file_and_the_receipt_names_a_tampered_install(tmp_path, tiny_env):
    env, lock, good, wheels = tiny_env
    marker = tmp_path / "ran"

    def run_python(code: str) -> str:
        return subprocess.run([str(env.python), "-c", code], capture_output=True, text=True, check=True).stdout

    assert wheel_cache.install(env.python) == 2
    assert run_python("import tinypkg; print(tinypkg.VALUE)") == "1\n"
    assert _problems(env, lock) == []

    # a twin with the pinned file's name is planted in the cache: refused by name, nothing installed
    tampered = make_wheel(tmp_path / "evil", startup_marker=marker)
    shutil.copy(tampered, wheels / WHEEL)
    with pytest.raises(wheel_cache.WheelCacheError, match=rf"{WHEEL}: sha256 {sha256(tampered)} is not the"):
        wheel_cache.install(env.python)
    run_python("pass")
    assert not marker.exists() and _problems(env, lock) == []

    # the same twin installed by hand, without hashes (the old way): the check names the package and the hook
    subprocess.run(
        [str(env.python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", "--no-index", str(tampered)],
        check=True,
    )
    run_python("pass")
    assert marker.exists()  # what the issue saw: its code runs at every interpreter start
    found = _problems(env, lock)
    assert (
        found[0].startswith("tinypkg 1.0: ")
        and "RECORD differs from the one the hash-checked install wrote" in found[0]
    )
    assert any("tinypkg-startup.pth: runs at every interpreter start" in line for line in found), found

    # set up again from the checked file: the receipt no longer vouches for tinypkg, so it is reinstalled
    shutil.copy(good, wheels / WHEEL)
    wheel_cache.install(env.python)
    marker.unlink()
    run_python("pass")
    assert not marker.exists() and _problems(env, lock) == []


def test_an_environment_without_a_receipt_fails_the_check(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (found,) = install_receipt.problems(tmp_path, site, tiny_lock(make_wheel(tmp_path / "pypi")), HOST)
    assert "no receipt of a hash-checked install" in found and "setup_cpu_env.sh" in found


def test_offline_a_package_missing_from_the_cache_is_named(tmp_path, monkeypatch):
    """No index (conftest's dead PIP_INDEX_URL): the cache alone serves, and what it lacks is named."""
    good = make_wheel(tmp_path / "pypi")
    private_cache(tmp_path)
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run(
        [str(base), "-m", "venv", "--without-pip", "--system-site-packages", str(tmp_path / "env")], check=True
    )
    monkeypatch.setattr(wheel_cache, "read_lock", lambda: tiny_lock(good))
    monkeypatch.setattr(wheel_cache, "check_fresh", lambda lock, expected: None)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(
        wheel_cache.WheelCacheError, match=r"1 package\(s\) are not in the wheel cache .* \(tinypkg\) and pip"
    ):
        wheel_cache.install(tmp_path / "env" / "bin" / "python", log=open(os.devnull, "w"))
    assert not (tmp_path / "user-cache" / "wheels" / ".download").exists()


def test_an_environment_of_another_python_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '{\"prefix\": \"/x\", \"purelib\": \"/x/lib\", \"version\": \"3.10\"}'\n")
    fake.chmod(0o755)
    with pytest.raises(wheel_cache.WheelCacheError, match=r"is Python 3\.10; requirements-cpu\.lock\.json holds"):
        wheel_cache.environment_of(fake)


def test_a_link_in_place_of_the_install_folders_is_removed_not_followed_and_a_linked_lock_is_refused(
    tmp_path, monkeypatch
):
    good = make_wheel(tmp_path / "pypi")
    _, wheels = private_cache(tmp_path)
    shutil.copy(good, wheels / WHEEL)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep").write_text("not ours to delete")
    (wheels / wheel_cache.VERIFIED).symlink_to(theirs)
    fd, cache = wheel_cache.open_cache()
    try:
        assert wheel_cache._stage(fd, cache, tiny_lock(good), HOST) == {"tinypkg": [sha256(good)]}
    finally:
        os.close(fd)
    assert (theirs / "keep").exists() and sorted(os.listdir(theirs)) == ["keep"]
    assert not (wheels / wheel_cache.VERIFIED).is_symlink() and (wheels / wheel_cache.VERIFIED / WHEEL).is_file()

    (wheels / wheel_cache.FLOCK).symlink_to(tmp_path / "victim")
    monkeypatch.setattr(wheel_cache, "read_lock", lambda: tiny_lock(good))
    monkeypatch.setattr(wheel_cache, "check_fresh", lambda lock, expected: None)
    monkeypatch.setattr(wheel_cache, "environment_of", lambda python: None)
    with pytest.raises(wheel_cache.WheelCacheError, match=r"\.install\.lock: cannot be opened without following links"):
        wheel_cache.install(tmp_path / "python")
    assert not (tmp_path / "victim").exists()
