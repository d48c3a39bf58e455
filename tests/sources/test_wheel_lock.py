"""requirements-cpu.lock.json (verl_patches/sources/wheel_lock.py): the sha256 of every file the CPU environment
installs, exactly for the versions the requirement files pin, for Linux x86_64 and aarch64."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sources_testlib import REPO_ROOT
from verl_patches.sources import wheel_lock
from verl_patches.sources.pins import parse_pins
from verl_patches.sources.wheel_lock import (
    LockedFile,
    LockedPackage,
    LockError,
    WheelLock,
    check_fresh,
    expected_pins,
    hashed_requirements,
    host_platform,
    lock_from_pylocks,
    lock_text,
    parse_lock,
    read_expected_pins,
    read_lock,
    stale_problems,
)

SHA = {c: c * 64 for c in "abcdef"}


def _wheel(file: str, sha: str) -> dict:
    return {"url": f"https://files.example/packages/xx/{file}", "hashes": {"sha256": sha}}


# ---- the committed lock ------------------------------------------------------------------------------------------
def test_the_committed_lock_covers_exactly_the_pinned_versions():
    lock = read_lock()
    assert stale_problems(lock, read_expected_pins()) == []
    assert lock_text(lock) == wheel_lock.LOCK.read_text(encoding="utf-8")  # as the generator writes it


def test_the_committed_lock_has_pypis_files_for_both_platforms():
    lock = read_lock()
    torch = {f.file: f.platforms for f in lock.packages["torch"].files}
    assert torch == {
        "torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl": ("x86_64",),
        "torch-2.5.1-cp311-cp311-manylinux2014_aarch64.whl": ("aarch64",),
    }
    # x86_64's torch wheel needs CUDA's libraries; aarch64 gets the CPU wheel, which does not
    assert lock.packages["nvidia-cublas-cu12"].platforms == ("x86_64",)
    assert lock.packages["triton"].platforms == ("x86_64",)
    for package in lock.packages.values():
        for plat in package.platforms:
            assert package.files_for(plat), (package.name, plat)
    sdists = sorted(p.name for p in lock.packages.values() if all(not f.file.endswith(".whl") for f in p.files))
    assert sdists == ["antlr4-python3-runtime", "transformers-stream-generator", "word2number"]  # no wheel on PyPI
    assert "torch-npu" not in lock.packages and lock.packages["ray"].requirement == "ray[default]==2.46.0"


def test_the_requirements_command_prints_what_pip_and_uv_take(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "verl_patches.sources.wheel_lock", "requirements", "--platform", "aarch64"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        "torch==2.5.1 \\\n    --hash=sha256:340ce0432cad0d37f5a31be666896e16788f1adf8ad7be481196b503dad675b9\n" in out
    )
    assert "nvidia-cublas-cu12" not in out
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        pytest.skip("uv is not installed (requirements-test.txt pins it)")
    reqs = tmp_path / "r.txt"
    reqs.write_text(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    # uv takes the file as hash-pinned requirements (every line pinned and hashed: a line without a hash stops it
    # before anything else) and only then finds no files in an empty folder
    proc = subprocess.run(
        [uv, "pip", "install", "--dry-run", "--no-config", "--no-cache", "--no-index", "--find-links", str(empty)]
        + ["--require-hashes", "--python", sys.executable, "--target", str(tmp_path / "t"), "-r", str(reqs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "was not found in the provided package locations" in proc.stderr, proc.stderr
    assert "--require-hashes" not in proc.stderr


# ---- made from uv's per-platform locks ---------------------------------------------------------------------------
def _pins(text: str):
    return parse_pins(text, "r.txt")


def test_the_lock_keeps_each_platforms_wheels_or_the_sdist_when_there_is_none():
    pylocks = {
        "x86_64": {
            "packages": [
                {
                    "name": "Foo",
                    "version": "1.0",
                    "sdist": _wheel("foo-1.0.tar.gz", SHA["a"]),
                    "wheels": [
                        _wheel("foo-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", SHA["b"]),
                        _wheel("foo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", SHA["c"]),
                    ],
                },
                {"name": "bar", "version": "2", "sdist": _wheel("bar-2.zip", SHA["d"])},
                {"name": "cuda-only", "version": "3", "wheels": [_wheel("cuda_only-3-py3-none-any.whl", SHA["e"])]},
            ]
        },
        "aarch64": {
            "packages": [
                {
                    "name": "foo",
                    "version": "1.0",
                    "wheels": [_wheel("foo-1.0-cp311-cp311-manylinux_2_17_aarch64.whl", SHA["f"])],
                },
                {"name": "bar", "version": "2", "sdist": _wheel("bar-2.zip", SHA["d"])},
            ]
        },
    }
    lock = lock_from_pylocks(pylocks, _pins("Foo[x]==1.0\nbar==2\n"))
    foo = lock.packages["foo"]
    assert foo.requirement == "Foo[x]==1.0" and foo.platforms == ("aarch64", "x86_64")
    assert [f.file for f in foo.files_for("x86_64")] == [
        "foo-1.0-cp311-cp311-manylinux_2_17_x86_64.whl",
        "foo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    ]  # the sdist is left out: a wheel exists
    assert lock.packages["bar"].files == (LockedFile("bar-2.zip", SHA["d"], ("aarch64", "x86_64")),)
    assert lock.packages["cuda-only"].platforms == ("x86_64",)
    assert parse_lock(lock_text(lock)) == lock
    text = hashed_requirements(lock, "aarch64")
    assert f"Foo[x]==1.0 \\\n    --hash=sha256:{SHA['f']}\n" in text and "cuda-only" not in text


def test_platforms_that_resolve_to_different_versions_are_refused():
    pylocks = {
        "x86_64": {"packages": [{"name": "foo", "version": "1", "sdist": _wheel("foo-1.tar.gz", SHA["a"])}]},
        "aarch64": {"packages": [{"name": "foo", "version": "2", "sdist": _wheel("foo-2.tar.gz", SHA["b"])}]},
    }
    with pytest.raises(LockError, match="foo: resolved to 2 on aarch64 and 1 on x86_64"):
        lock_from_pylocks(pylocks, {})


# ---- strict reading ----------------------------------------------------------------------------------------------
def _one_package_text(**changes) -> str:
    package = {
        "name": "foo",
        "version": "1.0",
        "requirement": "foo==1.0",
        "platforms": ["x86_64"],
        "files": [{"file": "foo-1.0-py3-none-any.whl", "sha256": SHA["a"], "platforms": ["x86_64"]}],
    }
    package.update(changes)
    return json.dumps({"comment": "", "python": "3.11", "platforms": ["aarch64", "x86_64"], "packages": [package]})


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"name": "Foo"}, r"packages\[0\]: key 'name': 'Foo' is not a canonical package name"),
        ({"requirement": "foo>=1.0"}, r"\(foo\): key 'requirement': 'foo>=1.0' is not foo\[extras\]==1.0"),
        ({"requirement": "bar==1.0"}, "key 'requirement'"),
        ({"platforms": ["ppc64le"]}, r"key 'platforms': expected a non-empty list of \['aarch64', 'x86_64'\]"),
        ({"platforms": ["aarch64"]}, r"foo==1.0: no file for aarch64"),
        ({"files": []}, "key 'files': expected a non-empty list"),
        (
            {"files": [{"file": "../foo-1.0-py3-none-any.whl", "sha256": SHA["a"], "platforms": ["x86_64"]}]},
            r"files\[0\]: key 'file': '../foo-1.0-py3-none-any.whl' is not a wheel or sdist file name",
        ),
        (
            {"files": [{"file": "foo-1.0-py3-none-any.whl", "sha256": "ABC", "platforms": ["x86_64"]}]},
            r"files\[0\]: key 'sha256': expected 64 lower-case hex digits",
        ),
        (
            {"files": [{"file": "bar-1.0-py3-none-any.whl", "sha256": SHA["a"], "platforms": ["x86_64"]}]},
            "bar-1.0-py3-none-any.whl is not a file of foo",
        ),
        ({"extra": 1}, r"keys \['extra', 'files', "),
    ],
)
def test_a_damaged_lock_is_refused_by_key(changes, match):
    with pytest.raises(LockError, match=rf"^requirements-cpu\.lock\.json: .*{match}"):
        parse_lock(_one_package_text(**changes))


def test_a_lock_for_another_python_or_not_json_is_refused():
    with pytest.raises(LockError, match="key 'python': '3.10'; this code installs CPython 3.11"):
        parse_lock(_one_package_text().replace('"3.11"', '"3.10"'))
    with pytest.raises(LockError, match="not valid JSON"):
        parse_lock("{")


@given(st.text(max_size=200))
def test_any_text_is_a_lock_or_one_lock_error(text):
    try:
        parse_lock(text)
    except LockError as err:
        assert "\n" not in str(err)


# ---- fresh against the pins --------------------------------------------------------------------------------------
def _lock_of(**versions: str) -> WheelLock:
    return WheelLock(
        {
            name: LockedPackage(
                name,
                v,
                f"{name}=={v}",
                ("x86_64",),
                (LockedFile(f"{name}-{v}-py3-none-any.whl", SHA["a"], ("x86_64",)),),
            )
            for name, v in versions.items()
        }
    )


def test_a_stale_lock_stops_the_set_up_with_the_command_that_regenerates_it():
    expected = expected_pins(
        _pins("torch==2.5.1\ntorch-npu==2.5.1.post1\n"), _pins("uv==0.13.9\n"), _pins("six==1.17.0\n")
    )
    assert sorted(expected) == ["six", "torch", "uv"]  # torch-npu is not installed on a CPU host
    assert stale_problems(_lock_of(torch="2.5.1", uv="0.13.9", six="1.17.0"), expected) == []
    stale = _lock_of(torch="2.5.0", uv="0.13.9", extra="1")
    assert stale_problems(stale, expected) == [
        "six==1.17.0 is pinned but not locked",
        "torch is locked at 2.5.0, pinned at 2.5.1",
        "extra is locked but pinned nowhere",
    ]
    with pytest.raises(
        LockError, match=r"r\.lock is stale: six==1\.17\.0 .*; regenerate it with `python -m verl_patches"
    ):
        check_fresh(stale, expected, "r.lock")


def test_inputs_that_pin_one_package_twice_must_agree():
    with pytest.raises(LockError, match=r"requirements\.txt:1: six==1\.16\.0, but another input pins 1\.17\.0"):
        expected_pins(_pins("six==1.16.0\ntorch-npu==1\n"), _pins(""), _pins("six==1.17.0\n"))


def test_a_host_the_lock_does_not_cover_is_named_with_what_it_covers():
    assert host_platform("x86_64", "Linux") == "x86_64" and host_platform("aarch64", "Linux") == "aarch64"
    with pytest.raises(LockError, match=r"this host is Linux ppc64le: .* on Linux aarch64 and x86_64 only"):
        host_platform("ppc64le", "Linux")
    with pytest.raises(LockError, match="this host is Darwin arm64"):
        host_platform("arm64", "Darwin")


@pytest.mark.network
@pytest.mark.timeout(600)
def test_generating_the_lock_again_gives_the_committed_one(monkeypatch):
    """PyPI's files do not change under a pinned version: a fresh resolution is the committed lock."""
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    try:
        lock = wheel_lock.generate()
    except LockError as err:
        if "Failed to fetch" in str(err) or "dns error" in str(err).lower():
            pytest.skip(f"package index unreachable: {err}")
        raise
    assert lock_text(lock) == wheel_lock.LOCK.read_text(encoding="utf-8")
