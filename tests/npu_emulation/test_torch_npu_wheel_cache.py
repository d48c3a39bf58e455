"""The pinned wheel is fetched into the cache only as the bytes that hash to the pin (a missing one is named with
the command that fetches it), and it and the parsed schemas are read from caches that cannot be planted: the wheel
through checked folders, never through a link, never when others can write it, and only as the very bytes that
hash to the pin; a parsed-schema file others could have written is ignored and the wheel read instead."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from verl_patches.npu_emulation.wheel_contract import contract, fetch
from verl_patches.npu_emulation.wheel_contract.pin import TORCH_NPU_WHEEL, WheelPin


def pin_of(data: bytes) -> WheelPin:
    return WheelPin(
        project="torch-npu",
        version="0",
        file="torch_npu-0-cp311-cp311-linux_x86_64.whl",
        sha256=hashlib.sha256(data).hexdigest(),
        url="https://example.invalid/torch_npu-0-cp311-cp311-linux_x86_64.whl",
        platform_tags=("linux_x86_64",),
        python_version="3.11",
        abi="cp311",
    )


def downloader(data: bytes, calls: list):
    def download(pin: WheelPin, dest: Path) -> Path:
        calls.append(pin.file)
        (dest / pin.file).write_bytes(data)
        return dest / pin.file

    return download


def test_fetch_refuses_a_download_with_another_hash_naming_the_file_and_keeps_nothing(tmp_path):
    pin, calls = pin_of(b"the pinned wheel"), []
    with pytest.raises(fetch.WheelMismatch, match=f"{pin.file}.*is not the pinned {pin.sha256}"):
        fetch.fetch_wheel(pin, tmp_path, download=downloader(b"another wheel", calls))
    assert calls == [pin.file] and list(tmp_path.iterdir()) == []  # no wheel, no temp folder left behind


def test_fetch_keeps_a_checked_wheel_and_replaces_one_that_is_not_the_pin(tmp_path):
    good = b"the pinned wheel"
    pin, calls = pin_of(good), []
    path = fetch.fetch_wheel(pin, tmp_path, download=downloader(good, calls))
    assert path == tmp_path / pin.file and path.read_bytes() == good and calls == [pin.file]
    assert fetch.fetch_wheel(pin, tmp_path, download=downloader(good, calls)) == path and len(calls) == 1  # cached
    path.write_bytes(b"corrupt")
    with pytest.raises(fetch.WheelMismatch, match=str(path)):
        fetch.verified_wheel(pin, tmp_path)
    assert fetch.fetch_wheel(pin, tmp_path, download=downloader(good, calls)).read_bytes() == good and len(calls) == 2


def test_a_missing_wheel_is_named_with_the_command_that_fetches_it(tmp_path):
    pin = pin_of(b"x")
    with pytest.raises(fetch.WheelError, match=f"{pin.file}.*not in the wheel cache.*{fetch.FETCH_COMMAND}"):
        fetch.verified_wheel(pin, tmp_path)


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir(mode=0o700)
    return wheels


def test_the_bytes_read_are_the_bytes_checked(folder):
    data = b"the pinned wheel"
    pin = pin_of(data)
    (folder / pin.file).write_bytes(data)
    assert fetch.wheel_bytes(pin, folder) == data
    (folder / pin.file).write_bytes(b"a wheel swapped in")
    with pytest.raises(fetch.WheelMismatch, match=f"{folder / pin.file}: sha256 .* is not the pinned"):
        fetch.wheel_bytes(pin, folder)


def test_a_linked_wheel_is_refused_even_to_the_pinned_bytes(folder, tmp_path):
    data = b"the pinned wheel"
    pin = pin_of(data)
    (tmp_path / "elsewhere.whl").write_bytes(data)
    (folder / pin.file).symlink_to(tmp_path / "elsewhere.whl")
    with pytest.raises(fetch.WheelError, match=f"{folder / pin.file}: cannot be opened"):
        fetch.wheel_bytes(pin, folder)
    with pytest.raises(fetch.WheelError, match="cannot be opened"):  # and fetch does not replace it blindly
        fetch.fetch_wheel(pin, folder, download=lambda p, d: pytest.fail("downloaded over a link"))


def test_a_wheel_others_can_write_is_refused(folder):
    data = b"the pinned wheel"
    pin = pin_of(data)
    (folder / pin.file).write_bytes(data)
    os.chmod(folder / pin.file, 0o666)
    with pytest.raises(fetch.WheelError, match=r"writable by group/others .*remove it and run"):
        fetch.wheel_bytes(pin, folder)


def test_a_wheel_folder_others_can_write_is_refused(folder):
    os.chmod(folder, 0o777)
    with pytest.raises(fetch.WheelError, match=f"{folder}: is writable by group/others"):
        fetch.wheel_bytes(pin_of(b"x"), folder)
    with pytest.raises(fetch.WheelError, match="writable by group/others"):
        fetch.fetch_wheel(pin_of(b"x"), folder, download=lambda p, d: pytest.fail("downloaded into it"))


@pytest.fixture()
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user cache of this test's own, holding (a copy of) the pinned wheel."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True, mode=0o700)
    (cache / "wheels" / TORCH_NPU_WHEEL.file).write_bytes(fetch.wheel_bytes())
    monkeypatch.setenv("VERL_OVERLAY_CACHE", str(cache))
    return cache


def _parsed_file(cache: Path) -> Path:
    return cache / contract.PARSED / contract._cache_name(TORCH_NPU_WHEEL.sha256)


def test_a_parsed_schema_file_others_could_have_written_is_ignored(private_cache):
    data = fetch.wheel_bytes()
    first = contract.read_contract(data, fetch.cached_wheel(), TORCH_NPU_WHEEL.sha256)
    parsed = _parsed_file(private_cache)
    assert parsed.is_file()  # the first read cached what it parsed
    planted = '{"npu_rms_norm": {"namespace": "npu", "name": "npu_rms_norm", "overload": "", "text": ' \
        '"npu_rms_norm(Tensor planted) -> Tensor", "source": "planted"}}'  # fmt: skip
    parsed.write_text(planted)
    os.chmod(parsed, 0o666)
    again = contract.read_contract(data, fetch.cached_wheel(), TORCH_NPU_WHEEL.sha256)
    assert again.schema("npu::npu_rms_norm").text == first.schema("npu::npu_rms_norm").text
    assert "planted" not in again.schema("npu::npu_rms_norm").text
    parsed.unlink()
    parsed.write_text('{"npu_rms_norm": {"not": "a schema row"}}')
    os.chmod(parsed, 0o600)  # ours, but not what this parser writes: read from the wheel again
    assert (
        contract.read_contract(data, fetch.cached_wheel(), TORCH_NPU_WHEEL.sha256).schema("npu::npu_rms_norm").text
        == first.schema("npu::npu_rms_norm").text
    )
