"""A route's tree that lacks a subfolder a device's jobs import (megatron-core's wheel: megatron/core without
megatron/training, which MindSpeed-LLM imports on A3) is refused by name: never packed by --export-cache for a
cluster, never installed on an NPU host, and reported INCOMPLETE by --verify there; the git tree passes.

The stand-in is the tests' tiny upstream `alpha`: its git tree has `data/`, its wheel does not, and the lock says
npu jobs need `data`. The device is faked with the override variable, as the other sources tests do."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from sources_testlib import (
    REPO_ROOT,
    V1_FILES,
    alpha_component,
    make_wheel,
    reference_tree_hash,
    run_setup,
    write_lock,
    write_tree,
)
from verl_patches.sources.lock import LockError, load_lock

WHEEL_FILES = {k: v for k, v in V1_FILES.items() if not k.startswith("data/")}  # the wheel lacks data/


def host(device: str) -> dict[str, str]:
    """This host seen as `device` by setup_sources.sh (the former variable name emptied, never refused)."""
    return {"VERL_PATCHES_DEVICE": device, "VERL_OVERLAY_DEVICE": ""}


def _pypi_hash() -> str:
    with tempfile.TemporaryDirectory() as d:
        return reference_tree_hash(write_tree(Path(d) / "t", WHEEL_FILES))


@pytest.fixture
def lock(tmp_path, upstream, index):
    """alpha: git tree complete, wheel without data/; npu jobs need data/, cpu jobs do not."""
    wheel = make_wheel(WHEEL_FILES)
    index.publish("alpha", "alpha-1.0-py3-none-any.whl", wheel)
    comp = alpha_component(upstream, index, artifact_bytes=wheel, needed_on=("cpu", "npu"), pypi_hash=_pypi_hash())
    path = write_lock(tmp_path / "lock" / "sources.lock", {"alpha": comp})
    with path.open("a") as f:
        f.write('\n[components.alpha.subfolders_needed_on]\nnpu = ["data"]\n')
    return path, index


def test_export_refuses_the_tree_without_the_subfolder_and_packs_the_git_one(lock, tmp_path, upstream):
    path, index = lock
    out = tmp_path / "cache"
    r = run_setup("--export-cache", out, "--route", "pypi", "--index-url", index.simple_url, lock=path, env=host("cpu"))
    assert r.rc == 1, r.text
    assert "not exported: alpha" in r.out
    assert "pypi: REFUSED: alpha/ lacks alpha/data (imported by npu jobs)" in r.text
    assert (
        not (out / "sources-cache.json").exists()
        or "alpha" not in json.loads((out / "sources-cache.json").read_text())["components"]
    )
    # with git reachable, the complete tree is exported (git is tried first)
    r = run_setup("--export-cache", out, "--index-url", index.simple_url, lock=path, env=host("cpu"))
    assert r.rc == 0, r.text
    assert json.loads((out / "sources-cache.json").read_text())["components"]["alpha"]["route"] == "git"


def test_verify_on_an_npu_host_refuses_the_tree_by_name(lock, tmp_path):
    path, index = lock
    root = tmp_path / "root"
    r = run_setup("--route", "pypi", "--index-url", index.simple_url, lock=path, root=root, env=host("cpu"))
    assert r.rc == 0, r.text  # a CPU host's jobs do not import data/
    assert run_setup("--verify", lock=path, root=root, env=host("cpu")).rc == 0
    v = run_setup("--verify", lock=path, root=root, env=host("npu"))
    assert v.rc == 1, v.text
    line = next(ln for ln in v.out.splitlines() if ln.startswith("alpha"))
    assert "INCOMPLETE" in line
    assert "alpha/ lacks alpha/data (imported by npu jobs)" in v.out
    j = run_setup("--verify", "--json", lock=path, root=root, env=host("npu"))
    assert json.loads(j.out)["components"][0]["status"] == "incomplete"


def test_setup_on_an_npu_host_never_installs_it_and_replaces_it_from_git(lock, tmp_path, upstream):
    path, index = lock
    root = tmp_path / "root"
    r = run_setup("--route", "pypi", "--index-url", index.simple_url, lock=path, root=root, env=host("npu"))
    assert r.rc == 1, r.text
    assert "REFUSED: alpha/ lacks alpha/data" in r.text and not (root / "alpha").exists()
    # installed on a CPU host from the wheel, then set up on an NPU host: rebuilt from git (no --force needed:
    # the folder is exactly what its route pins, nothing of the user's is lost)
    assert run_setup("--route", "pypi", "--index-url", index.simple_url, lock=path, root=root, env=host("cpu")).rc == 0
    r = run_setup("--index-url", index.simple_url, lock=path, root=root, env=host("npu"))
    assert r.rc == 0, r.text
    assert (root / "alpha" / "data" / "table.txt").is_file()
    assert run_setup("--verify", lock=path, root=root, env=host("npu")).rc == 0


def test_a_symlink_in_place_of_the_subfolder_does_not_count(lock, tmp_path):
    path, index = lock
    root = tmp_path / "root"
    assert run_setup("--route", "pypi", "--index-url", index.simple_url, lock=path, root=root, env=host("cpu")).rc == 0
    from verl_patches.sources.required_parts import missing_subfolders

    comp = load_lock(path).components["alpha"]
    (tmp_path / "elsewhere").mkdir()
    (root / "alpha" / "data").symlink_to(tmp_path / "elsewhere")
    assert missing_subfolders(comp, root / "alpha", ["npu"]) == {"npu": ["data"]}
    assert missing_subfolders(comp, root / "alpha", ["cpu"]) == {}


def test_the_real_lock_needs_megatron_training_on_npu_only():
    comp = load_lock(REPO_ROOT / "sources.lock").components["megatron"]
    assert comp.subfolders_needed_on == {"npu": ("training",)}


def test_the_pinned_megatron_wheel_lacks_megatron_training_and_the_git_tree_has_it():
    """The fact behind the lock entry, from the per-file records committed beside the lock."""
    from verl_patches.sources.manifests import load_manifest

    lock = REPO_ROOT / "sources.lock"
    wheel, git = load_manifest(lock, "megatron", "pypi"), load_manifest(lock, "megatron", "git")
    assert any(f.startswith("core/") for f in wheel) and not any(f.startswith("training/") for f in wheel)
    assert any(f.startswith("training/") for f in git)


@pytest.mark.parametrize(
    "table, message",
    [
        ('gpu = ["training"]', "subfolders_needed_on.gpu: unknown device"),
        ('npu = ["../training"]', "subfolders_needed_on.npu"),
        ('npu = "training"', "expected a list of folder names"),
    ],
)
def test_the_lock_refuses_a_malformed_entry(tmp_path, upstream, table, message):
    path = write_lock(tmp_path / "sources.lock", {"alpha": alpha_component(upstream)})
    with path.open("a") as f:
        f.write(f"\n[components.alpha.subfolders_needed_on]\n{table}\n")
    with pytest.raises(LockError, match=message.replace(".", r"\.")):
        load_lock(path)
