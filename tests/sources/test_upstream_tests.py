"""A component's own tests unpacked from its pinned PyPI artifact (verl_patches/sources/upstream_tests.py): the
artifact's sha256 and the folder's tree hash are the lock's, a pristine folder is kept, anything else is replaced or
refused, and nothing half-unpacked is ever left in place."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from verl_patches.sources import upstream_tests
from verl_patches.sources.errors import IntegrityError, RouteUnavailable
from verl_patches.sources.lock import LockError, load_lock
from verl_patches.sources.treehash import tree_hash

FILES = {"pkg-1.0/tests/__init__.py": b"", "pkg-1.0/tests/test_a.py": b"def test_a():\n    pass\n"}
FILES_OTHER = {"pkg-1.0/pkg/__init__.py": b"VERSION = 1\n"}


def _sdist(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tests_hash(tmp_path: Path, files: dict[str, bytes]) -> str:
    folder = tmp_path / "reference"
    for name, data in files.items():
        if name.startswith("pkg-1.0/tests/"):
            target = folder / name.removeprefix("pkg-1.0/tests/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return tree_hash(folder)


def _lock(tmp_path: Path, sdist: bytes, tests_table: str) -> Path:
    sha = hashlib.sha256(sdist).hexdigest()
    path = tmp_path / "repo" / "sources.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""schema = 1
[prelude]
file = "pkg/x.py"
line = "import y"
[components.pkg]
package = "pkg"
git_urls = ["https://example.invalid/pkg.git"]
ref = "refs/tags/v1"
commit = "{"a" * 40}"
git_subdir = "pkg"
[components.pkg.pypi]
name = "pkg"
version = "1.0"
file = "pkg-1.0.tar.gz"
sha256 = "{sha}"
subdir = "pkg-1.0/pkg"
{tests_table}
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def pinned(tmp_path):
    """A lock pinning pkg's tests, and a user cache holding the artifact (nothing is downloaded)."""
    sdist = _sdist({**FILES, **FILES_OTHER})
    digest = _tests_hash(tmp_path, FILES)
    table = f'[components.pkg.upstream_tests]\npypi_subdir = "pkg-1.0/tests"\ntree_sha256 = "{digest}"'
    lock = load_lock(_lock(tmp_path, sdist, table))
    cache = tmp_path / "user-cache"
    (cache / "pypi").mkdir(parents=True)
    (cache / "pypi" / "pkg-1.0.tar.gz").write_bytes(sdist)
    return lock, cache


def test_install_unpacks_the_pinned_tests_beside_the_sources_and_keeps_them(pinned, tmp_path):
    lock, cache = pinned
    root = tmp_path / "repo"
    folder = upstream_tests.install(root, lock, "pkg", cache=cache, offline=True)
    assert folder == root / ".upstream_tests" / "pkg" / "tests"
    assert (folder / "test_a.py").read_bytes() == FILES["pkg-1.0/tests/test_a.py"]
    assert not (root / "pkg").exists()  # never into the package folder
    inode = folder.stat().st_ino
    (cache / "pypi" / "pkg-1.0.tar.gz").unlink()  # a pristine folder needs no artifact
    assert upstream_tests.install(root, lock, "pkg", cache=cache, offline=True).stat().st_ino == inode


def test_an_edited_folder_is_replaced_by_the_pinned_one(pinned, tmp_path):
    lock, cache = pinned
    root = tmp_path / "repo"
    folder = upstream_tests.install(root, lock, "pkg", cache=cache, offline=True)
    (folder / "test_a.py").write_text("def test_a():\n    assert False\n")
    (folder / "extra.py").write_text("")
    folder = upstream_tests.install(root, lock, "pkg", cache=cache, offline=True)
    assert (folder / "test_a.py").read_bytes() == FILES["pkg-1.0/tests/test_a.py"] and not (
        folder / "extra.py"
    ).exists()
    assert [p.name for p in folder.parent.iterdir() if p.name != ".install.lock"] == ["tests"]  # no leftovers


def test_an_artifact_whose_tests_differ_from_the_pin_is_refused_and_nothing_is_swapped_in(tmp_path):
    sdist = _sdist({**FILES, **FILES_OTHER})
    table = f'[components.pkg.upstream_tests]\npypi_subdir = "pkg-1.0/tests"\ntree_sha256 = "{"0" * 64}"'
    lock = load_lock(_lock(tmp_path, sdist, table))
    cache = tmp_path / "user-cache"
    (cache / "pypi").mkdir(parents=True)
    (cache / "pypi" / "pkg-1.0.tar.gz").write_bytes(sdist)
    with pytest.raises(IntegrityError, match="pkg-1.0/tests/ unpacks to tree hash .* components.pkg.upstream_tests"):
        upstream_tests.install(tmp_path / "repo", lock, "pkg", cache=cache, offline=True)
    assert not (tmp_path / "repo" / ".upstream_tests" / "pkg" / "tests").exists()
    assert [p.name for p in (tmp_path / "repo" / ".upstream_tests" / "pkg").iterdir()] == [".install.lock"]


def test_an_artifact_that_is_not_the_pinned_file_is_never_unpacked(pinned, tmp_path):
    lock, cache = pinned
    (cache / "pypi" / "pkg-1.0.tar.gz").write_bytes(_sdist({**FILES, "pkg-1.0/tests/evil.py": b"x = 1\n"}))
    with pytest.raises(RouteUnavailable, match="not in the cache and --offline"):  # the foreign file is dropped
        upstream_tests.install(tmp_path / "repo", lock, "pkg", cache=cache, offline=True)
    assert not (cache / "pypi" / "pkg-1.0.tar.gz").exists()


@pytest.mark.parametrize(
    "table, message",
    [
        ("", "components.pkg.upstream_tests: missing"),
        ('[components.pkg.upstream_tests]\npypi_subdir = "../x"\ntree_sha256 = "' + "0" * 64 + '"', "pypi_subdir"),
        ('[components.pkg.upstream_tests]\npypi_subdir = "pkg-1.0/tests"\ntree_sha256 = "abc"', "tree_sha256"),
    ],
)
def test_a_malformed_pin_is_refused_naming_the_key(tmp_path, table, message):
    lock = load_lock(_lock(tmp_path, _sdist(FILES), table))
    with pytest.raises(LockError, match=message):
        upstream_tests.read_pin(lock, "pkg")


def test_the_repositorys_lock_pins_vllm_ascends_tests_in_its_sdist():
    lock = load_lock(Path(__file__).resolve().parents[2] / "sources.lock")
    pin = upstream_tests.read_pin(lock, "vllm_ascend")
    assert pin.pypi_subdir == lock.components["vllm_ascend"].pypi.subdir.rsplit("/", 1)[0] + "/tests"
