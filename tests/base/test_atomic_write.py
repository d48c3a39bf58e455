"""verl_patches.base.atomic_write: files put in place whole, with the umask's mode, by any number of writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from verl_patches.base import atomic_write as aw


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if aw.is_temp_name(p.name))


@pytest.fixture
def umask():
    """Set a umask for the test body, restore the process's after."""
    old = os.umask(0o022)
    os.umask(old)

    def set_to(mask: int) -> None:
        os.umask(mask)

    yield set_to
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002, 0o000])
def test_every_writer_honours_the_umask(tmp_path: Path, umask, mask: int) -> None:
    umask(mask)
    src = tmp_path / "src.bin"
    src.write_bytes(b"x")
    writers = {
        "bytes": lambda p: aw.write_bytes_atomically(p, b"b"),
        "text": lambda p: aw.write_text_atomically(p, "t"),
        "json": lambda p: aw.write_json_atomically(p, {"a": 1}),
        "copy": lambda p: aw.copy_file_atomically(src, p),
        "path": lambda p: aw.write_atomically(p, lambda tmp: tmp.write_bytes(b"p")),
    }
    for name, write in writers.items():
        write(tmp_path / name)
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
    with aw.atomic_open(tmp_path / "open", "w") as f:
        f.write("o")
    assert (tmp_path / "open").stat().st_mode & 0o777 == 0o666 & ~mask
    folder = aw.temp_dir_for(tmp_path / "built")
    assert folder.stat().st_mode & 0o777 == 0o777 & ~mask  # mkdtemp would say 0700 whatever the umask
    assert _leftovers(tmp_path) == [folder.name]


def test_an_explicit_mode_wins_over_the_umask(tmp_path: Path) -> None:
    aw.write_bytes_atomically(tmp_path / "run.sh", b"#!/bin/sh\n", mode=0o755)
    assert (tmp_path / "run.sh").stat().st_mode & 0o777 == 0o755


def test_a_failing_writer_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    aw.write_json_atomically(target, {"v": 1})

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text('{"v": 2, "half', encoding="utf-8")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        aw.write_atomically(target, half_then_fail)
    with pytest.raises(KeyboardInterrupt):
        with aw.atomic_open(target, "w") as f:
            f.write("partial")
            raise KeyboardInterrupt
    assert json.loads(target.read_text()) == {"v": 1}
    assert _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="not a write mode"):
        with aw.atomic_open(target, "r"):
            pass


def test_a_new_target_never_appears_half_written(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.bin"  # the folder is created

    def failing(tmp: Path) -> None:
        tmp.write_bytes(b"x" * 1000)
        raise OSError("boom")

    with pytest.raises(OSError, match="boom"):
        aw.write_atomically(target, failing)
    assert not target.exists() and _leftovers(target.parent) == []


def test_a_killed_writer_leaves_only_a_temp_that_is_recognised_and_removed(tmp_path: Path) -> None:
    code = (
        "import os, sys\nfrom verl_patches.base.atomic_write import atomic_open\n"
        f"with atomic_open({str(tmp_path / 'out.txt')!r}, 'w') as f:\n"
        "    f.write('half'); f.flush(); os._exit(9)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 9
    assert not (tmp_path / "out.txt").exists()
    (left,) = _leftovers(tmp_path)
    assert left.endswith(".out.txt") and left.startswith(aw.TMP_PREFIX)
    (tmp_path / "notes.tmp").write_text("a user's")  # never ours, whatever it is named
    (tmp_path / ".verl_patches-tmp-notes").write_text("not our pattern")
    assert aw.remove_stale_temps(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".verl_patches-tmp-notes", "notes.tmp"]


def test_concurrent_writers_of_one_target_never_collide(tmp_path: Path) -> None:
    """Each writer has its own temp (a fixed ``.tmp`` name made two relocks overwrite each other's temp and
    fail their rename); the target always holds one writer's whole content."""
    target = tmp_path / "sources.lock"
    payloads = [(f"writer {i}\n" * 20_000) for i in range(6)]
    errors: list[BaseException] = []
    seen: set[str] = set()

    def write(text: str) -> None:
        try:
            for _ in range(15):
                aw.write_text_atomically(target, text)
                seen.add(target.read_text(encoding="utf-8"))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen <= set(payloads) and target.read_text(encoding="utf-8") in payloads
    assert _leftovers(tmp_path) == []


def test_temp_names_are_unique_and_recognisable(tmp_path: Path) -> None:
    target = tmp_path / ("n" * 250)  # a long name is cut so the temp name stays a valid name
    names = {aw.temp_path_for(target).name for _ in range(50)}
    assert len(names) == 50 and all(aw.is_temp_name(n) and len(n.encode()) <= 255 for n in names)
    owned = aw.temp_path_for(target, owned=True).name
    assert aw.is_temp_name(owned) and f".{os.getpid()}@{aw.host_tag()}." in owned and len(owned.encode()) <= 255
    for name in ("x.tmp", ".verl_patches-tmp-0123.x", "verl_patches-tmp-0123456789abcdef.x"):
        assert not aw.is_temp_name(name)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_only_a_dead_writers_owned_temps_are_abandoned(tmp_path: Path) -> None:
    host, tmp = aw.host_tag(), ".verl_patches-tmp-0123456789abcdef"
    dead = f"{tmp}.{_dead_pid()}@{host}.train.parquet"
    alive = f"{tmp}.{os.getppid()}@{host}.train.parquet"
    mine = f"{tmp}.{os.getpid()}@{host}.train.parquet"
    elsewhere = f"{tmp}.{_dead_pid()}@another-host.train.parquet"
    unowned = f"{tmp}.train.parquet"
    for name in (dead, alive, mine, elsewhere, unowned):
        (tmp_path / name).write_bytes(b"partial")
    link = f"{tmp}.{_dead_pid()}@{host}.link"
    os.symlink(tmp_path / unowned, tmp_path / link)  # a link is never removed, whatever its name
    assert aw.remove_abandoned_temps(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive, mine, elsewhere, unowned, link])


def test_commit_flushes_and_replaces_with_a_new_inode(tmp_path: Path) -> None:
    target = tmp_path / "shard.bin"
    target.write_bytes(b"old")
    before = target.stat().st_ino
    with aw.atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.exists()  # created empty, beside the target
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # not yet visible
    assert target.read_bytes() == b"new" and target.stat().st_ino != before


def test_a_folder_is_swapped_in_whole_and_the_old_one_removed(tmp_path: Path) -> None:
    target = tmp_path / "pkg"
    target.mkdir()
    (target / "old.py").write_text("old")
    new = aw.temp_dir_for(target)
    (new / "new.py").write_text("new")
    aw.swap_folder_in(new, target, tmp_path / ".pkg.old")
    assert sorted(p.name for p in target.iterdir()) == ["new.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]
    fresh = aw.temp_dir_for(tmp_path / "other")
    aw.swap_folder_in(fresh, tmp_path / "other", tmp_path / ".other.old")  # nothing there before
    assert (tmp_path / "other").is_dir() and not (tmp_path / ".other.old").exists()


def test_rename_durably_moves_across_folders(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    aw.rename_durably(tmp_path / "a" / "f", tmp_path / "b" / "g")
    assert (tmp_path / "b" / "g").read_text() == "x" and not (tmp_path / "a" / "f").exists()


def test_json_layout_is_what_readers_diff(tmp_path: Path) -> None:
    aw.write_json_atomically(tmp_path / "a.json", {"b": 1, "a": [1, 2]})
    assert (tmp_path / "a.json").read_text() == '{\n  "b": 1,\n  "a": [\n    1,\n    2\n  ]\n}\n'
    aw.write_json_atomically(tmp_path / "b.json", {"b": 1, "a": 2}, indent=None, sort_keys=True)
    assert (tmp_path / "b.json").read_text() == '{"a": 2, "b": 1}\n'


# --- issue 41 class 4: a temp is written through the descriptor that created it, never reopened by name ------------


@pytest.fixture
def swap_temp_for_link(monkeypatch, tmp_path: Path):
    """Every temp created from now on is swapped for a link to ``victim`` right after its exclusive create and
    before anything is written: the race another account of a shared folder won once in four runs."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    real_open = os.open
    swapped: list[str] = []

    def create_then_swap(path, flags, *a, dir_fd=None, **k):
        fd = real_open(path, flags, *a, dir_fd=dir_fd, **k)
        if flags & os.O_EXCL and aw.TMP_PREFIX in os.fspath(path):
            os.unlink(path, dir_fd=dir_fd)
            os.symlink(victim, path, dir_fd=dir_fd)
            swapped.append(os.fspath(path))
        return fd

    monkeypatch.setattr(os, "open", create_then_swap)
    return victim, swapped


def _writes_by_descriptor(folder: Path) -> dict:
    return {
        "text": lambda: aw.write_text_atomically(folder / "out", "new"),
        "bytes": lambda: aw.write_bytes_atomically(folder / "out", b"new"),
        "json": lambda: aw.write_json_atomically(folder / "out", {"new": 1}),
        "private": lambda: aw.write_bytes_atomically(folder / "out", b"new", mode=0o600),
        "open": lambda: _open_and_write(folder / "out"),
    }


def _open_and_write(target: Path) -> None:
    with aw.atomic_open(target, "w") as f:
        f.write("new")


@pytest.mark.parametrize("writer", ["text", "bytes", "json", "private", "open"])
def test_a_temp_swapped_for_a_link_before_the_write_is_neither_followed_nor_published(
    tmp_path: Path, swap_temp_for_link, writer: str
) -> None:
    victim, swapped = swap_temp_for_link
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "out").write_text("old")
    with pytest.raises(aw.TempReplaced, match=r"replaced by a symbolic link while being written; not put in place"):
        _writes_by_descriptor(folder)[writer]()
    assert len(swapped) == 1
    assert victim.read_text() == "precious"  # the write went to the descriptor, not through the link
    assert (folder / "out").read_text() == "old" and not (folder / "out").is_symlink()  # the link is not published
    assert sorted(p.name for p in folder.iterdir()) == ["out"]  # the planted link is gone with the temp


def test_the_same_writers_without_the_swap_open_each_temp_once_to_create_it(tmp_path: Path, monkeypatch) -> None:
    """No reopen by name at all: the only open of a temp's name is its exclusive create."""
    import io

    opens: list[tuple[str, int]] = []
    real_os_open, real_io_open = os.open, io.open

    def os_open(path, flags, *a, **k):
        opens.append((os.fspath(path), flags))
        return real_os_open(path, flags, *a, **k)

    def io_open(file, *a, **k):
        if not isinstance(file, int):
            opens.append((os.fspath(file), -1))
        return real_io_open(file, *a, **k)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)
    for name, write in _writes_by_descriptor(tmp_path).items():
        opens.clear()
        write()
        temps = [(path, flags) for path, flags in opens if aw.TMP_PREFIX in path]
        assert len(temps) == 1 and temps[0][1] != -1 and temps[0][1] & os.O_EXCL, (name, opens)
        assert (tmp_path / "out").exists(), name
    opens.clear()
    aw.write_atomically(tmp_path / "out", lambda p: p.write_text("by name"))  # the path API: the writer reopens
    assert sum(aw.TMP_PREFIX in path for path, _ in opens) == 2
    assert _leftovers(tmp_path) == []


def test_a_path_writers_temp_swapped_while_it_wrote_is_not_published(tmp_path: Path) -> None:
    """Writers that only take a path (torch.save) open the temp by name; a temp that no longer names the file
    created for it when they are done is refused, whether a link or another file took its place."""
    (tmp_path / "out").write_text("old")
    other = tmp_path / "other"
    other.write_text("theirs")

    def writes_then_swapped_for(kind: str):
        def writer(tmp: Path) -> None:
            tmp.write_text("new")
            tmp.unlink()
            if kind == "link":
                tmp.symlink_to(other)
            else:
                tmp.write_text("theirs")

        return writer

    for kind, needle in (("link", "a symbolic link"), ("file", "another file")):
        with pytest.raises(aw.TempReplaced, match=f"replaced by {needle} while being written"):
            aw.write_atomically(tmp_path / "out", writes_then_swapped_for(kind))
        assert (tmp_path / "out").read_text() == "old" and other.read_text() == "theirs"
    assert _leftovers(tmp_path) == []


def test_a_folder_renamed_away_mid_write_does_not_redirect_it(tmp_path: Path) -> None:
    """Relative to the folder's descriptor: the file lands in the folder that was opened, not where a link put
    in its place would send it."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(run, tmp_path / "moved")
        run.symlink_to(elsewhere)
        aw.write_text_at(fd, "pids.json", "{}", folder=run)
    finally:
        os.close(fd)
    assert (tmp_path / "moved" / "pids.json").read_text() == "{}"
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(ValueError, match="is not one file name"):
        aw.write_text_at(os.open(tmp_path, os.O_RDONLY), "../x", "")


def test_a_private_file_is_never_readable_by_others_not_even_half_written(tmp_path: Path, umask, monkeypatch) -> None:
    umask(0o000)
    seen: list[int] = []
    real = aw._write_all

    def look(fd: int, data: bytes) -> None:
        seen.append(stat_mode(os.fstat(fd)))
        real(fd, data)

    monkeypatch.setattr(aw, "_write_all", look)
    aw.write_bytes_atomically(tmp_path / "secret", b"k" * 32, mode=0o600)
    aw.write_bytes_atomically(tmp_path / "run.sh", b"#!/bin/sh\n", mode=0o755)
    assert seen == [0o600, 0o600]  # while written: 0600, whatever the umask and the final mode
    assert stat_mode((tmp_path / "secret").stat()) == 0o600 and stat_mode((tmp_path / "run.sh").stat()) == 0o755


def stat_mode(st: os.stat_result) -> int:
    return st.st_mode & 0o777


def test_commit_refuses_a_temp_that_became_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    tmp = aw.temp_path_for(tmp_path / "out")
    tmp.unlink()
    tmp.symlink_to(victim)
    with pytest.raises(aw.TempReplaced, match="replaced by a symbolic link"):
        aw.commit(tmp, tmp_path / "out")
    assert not (tmp_path / "out").exists() and victim.read_text() == "precious"


def test_create_bytes_at_never_replaces_and_is_private_from_the_first_byte(tmp_path: Path, umask) -> None:
    umask(0o000)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        aw.create_bytes_at(fd, "secret", b"k" * 64, folder=tmp_path)
        assert (tmp_path / "secret").read_bytes() == b"k" * 64 and stat_mode((tmp_path / "secret").stat()) == 0o600
        with pytest.raises(FileExistsError):
            aw.create_bytes_at(fd, "secret", b"other", folder=tmp_path)
        (tmp_path / "link").symlink_to(tmp_path / "nowhere")
        with pytest.raises(FileExistsError):  # a dangling link is a name too: never followed, never replaced
            aw.create_bytes_at(fd, "link", b"x", folder=tmp_path)
    finally:
        os.close(fd)
    assert (tmp_path / "secret").read_bytes() == b"k" * 64 and not (tmp_path / "nowhere").exists()
    assert _leftovers(tmp_path) == []
