"""verl_patches.base.regular_file: a small input read with a bound, never blocking, never through the wrong kind."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from verl_patches.base.regular_file import FileRefused, read_regular_file


def test_the_bound_is_enforced_and_named(tmp_path: Path) -> None:
    p = tmp_path / "settings.env"
    p.write_bytes(b"x" * 100)
    assert read_regular_file(p, max_bytes=100) == b"x" * 100  # exactly the bound: read
    with pytest.raises(FileRefused) as e:
        read_regular_file(p, max_bytes=99)
    assert str(e.value) == f"{p}: 100 bytes, more than the 99 this file may have"
    assert read_regular_file(tmp_path / "settings.env", max_bytes=1 << 20, follow_symlinks=False) == b"x" * 100


def test_missing_and_folders_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FileRefused, match=f"^{tmp_path / 'none'}: no such file$"):
        read_regular_file(tmp_path / "none", max_bytes=10)
    with pytest.raises(FileRefused, match=r": not a regular file \(a directory\)$"):
        read_regular_file(tmp_path, max_bytes=10)
    with pytest.raises(FileRefused, match=r"/dev/null: not a regular file \(a character device\)$"):
        read_regular_file("/dev/null", max_bytes=10)


def test_a_symlink_is_followed_only_when_asked(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("hunter2")
    link = tmp_path / "link"
    os.symlink(secret, link)
    assert read_regular_file(link, max_bytes=100) == b"hunter2"
    with pytest.raises(FileRefused) as e:
        read_regular_file(link, max_bytes=100, follow_symlinks=False)
    assert str(e.value) == f"{link}: not a regular file (a symbolic link)" and "hunter2" not in str(e.value)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    t = threading.Thread(target=lambda: outcome.append(_refusal(fifo)), daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert isinstance(outcome[0], FileRefused) and "a FIFO (named pipe)" in str(outcome[0])


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(FileRefused, match=r"not a regular file \(a socket\)"):
            read_regular_file(path, max_bytes=10)


def _refusal(path: Path) -> BaseException:
    try:
        read_regular_file(path, max_bytes=10)
    except FileRefused as err:
        return err
    raise AssertionError("read a FIFO")
