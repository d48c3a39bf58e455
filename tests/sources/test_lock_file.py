"""sources.lock: the committed pins and manifests agree with each other, and bad locks get clear errors."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess

import pytest

from sources_testlib import REPO_ROOT, run_setup, write_lock
from verl_patches.sources.lock import LockError, load_lock, rewrite_tree_hash

LOCK = REPO_ROOT / "sources.lock"
MANIFESTS = REPO_ROOT / "sources.manifests"

# DESIGN.md §3: the pins the whole project is built on.
DESIGN_PINS = {
    "verl": ("verl", "refs/tags/v0.4.0", "0758489422e8d41a89e6c36d4c477714520f0dcc", "verl-0.4.0-py2.py3-none-any.whl"),
    "vllm": ("vllm", "refs/tags/v0.9.1", "b6553be1bc75f046b00046a4ad7576364d03c835", "vllm-0.9.1.tar.gz"),
    "vllm_ascend": (
        "vllm_ascend",
        "refs/tags/v0.9.1",
        "0740d10211fcdcaa00d29e8659d7de892f5ed4d8",
        "vllm_ascend-0.9.1.tar.gz",
    ),
    "megatron": (
        "megatron",
        "refs/tags/core_r0.8.0",
        "baf94af3c667248865f23df73b9fb8e2395e6fd0",
        "megatron_core-0.8.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
    ),
    "mindspeed": ("mindspeed", "refs/tags/v2.0.0_core_r0.8.0", "dc83a031a2653341be1690013c11cfbf556155c5", None),
    "mindspeed_llm": ("mindspeed_llm", "refs/tags/v2.0.0", "3a712f58635be8825189c65a89f27a90dc458765", None),
}


def _combine(records: dict[str, str]) -> str:
    """The tree hash of per-file records, written out here rather than imported."""
    h = hashlib.sha256()
    for rel in sorted(records):
        h.update(f"{records[rel]} {rel}\n".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------- committed data


def test_committed_lock_pins_are_design_pins():
    lock = load_lock(LOCK)
    assert set(lock.components) == set(DESIGN_PINS)
    for name, (package, ref, commit, pypi_file) in DESIGN_PINS.items():
        c = lock.components[name]
        assert (c.package, c.ref, c.commit) == (package, ref, commit), name
        assert (c.pypi.file if c.pypi else None) == pypi_file, name
        assert c.git_urls, name
        assert c.tree_sha256.get("git"), f"{name}: no git tree hash"
        if pypi_file:
            assert c.tree_sha256.get("pypi"), f"{name}: no pypi tree hash"
            assert re.fullmatch(r"[0-9a-f]{64}", c.pypi.sha256)
    assert lock.prelude_file == "verl/workers/megatron_workers.py"
    assert lock.prelude_line == "from verl_patches import prelude_patch"
    # git-only components must name a mirror reachable from China first (gitcode/gitee), GitHub last
    for name in ("mindspeed", "mindspeed_llm"):
        assert len(lock.components[name].git_urls) >= 2
        assert lock.components[name].needed_on == ("npu",)


def _manifest_files():
    return sorted(MANIFESTS.glob("*.json"))


def test_every_lock_hash_has_a_manifest_and_every_manifest_a_lock_hash():
    lock = load_lock(LOCK)
    expected = {f"{n}.{r}.json" for n, c in lock.components.items() for r in c.expected_hashes()}
    assert {p.name for p in _manifest_files()} == expected


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.name)
def test_manifest_combines_to_the_lock_tree_hash(path):
    lock = load_lock(LOCK)
    component, route = path.name[: -len(".json")].split(".")
    body = json.loads(path.read_text())
    assert (body["component"], body["route"]) == (component, route)
    files = body["files"]
    assert files and all(re.fullmatch(r"[-xl] [0-9a-f]{64}", rec) for rec in files.values())
    assert not any("__pycache__" in rel or rel.endswith((".pyc", ".pyo")) for rel in files)
    assert _combine(files) == body["tree_sha256"] == lock.components[component].tree_sha256[route]


# --------------------------------------------------------------------------- errors name file and key

GOOD = {
    "package": "alpha",
    "git_urls": ["file:///nowhere.git"],
    "ref": "refs/tags/v1",
    "commit": "a" * 40,
    "git_subdir": "alpha",
    "needed_on": ["cpu"],
    "tree_sha256": {"git": "b" * 64},
}


def _err(tmp_path, components, **kw) -> str:
    p = write_lock(tmp_path / "bad.lock", components, **kw)
    with pytest.raises(LockError) as e:
        load_lock(p)
    return str(e.value)


def test_good_test_lock_loads(tmp_path):
    lock = load_lock(write_lock(tmp_path / "ok.lock", {"alpha": GOOD}))
    assert lock.components["alpha"].commit == "a" * 40


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c.pop("commit"), "components.alpha: missing key 'commit'"),
        (lambda c: c.update(commit="abc123"), "components.alpha.commit"),
        (lambda c: c.update(git_urls=[]), "components.alpha.git_urls"),
        (lambda c: c.update(package=3), "components.alpha.package: expected str"),
        (lambda c: c.update(needed_on=["tpu"]), "components.alpha.needed_on"),
        (lambda c: c.update(tree_sha256={"svn": "b" * 64}), "components.alpha.tree_sha256.svn"),
        (lambda c: c.update(tree_sha256={"git": "xyz"}), "components.alpha.tree_sha256.git"),
        (lambda c: c.update(tree_sha256={"pypi": "b" * 64}), "components.alpha.tree_sha256.pypi"),
        (
            lambda c: c.update(pypi={"name": "a", "version": "1", "file": "a.whl", "sha256": "00", "subdir": "a"}),
            "components.alpha.pypi.sha256",
        ),
        (
            lambda c: c.update(pypi={"name": "a", "version": "1", "sha256": "0" * 64, "subdir": "a"}),
            "components.alpha.pypi: missing key 'file'",
        ),
    ],
)
def test_malformed_component_names_file_and_key(tmp_path, mutate, expected):
    comp = json.loads(json.dumps(GOOD))
    mutate(comp)
    msg = _err(tmp_path, {"alpha": comp})
    assert "bad.lock" in msg and expected in msg


def test_file_level_errors_name_the_file(tmp_path):
    with pytest.raises(LockError, match="missing.lock: lock file not found"):
        load_lock(tmp_path / "missing.lock")
    bad = tmp_path / "syntax.lock"
    bad.write_text("schema = 1\n[components.a\n")
    with pytest.raises(LockError, match="syntax.lock: not valid TOML"):
        load_lock(bad)
    noschema = tmp_path / "schema.lock"
    noschema.write_text("schema = 2\n")
    with pytest.raises(LockError, match="schema.lock: key 'schema' must be 1"):
        load_lock(noschema)
    msg = _err(tmp_path, {"a": GOOD, "b": GOOD})
    assert "share a package folder" in msg
    p = write_lock(tmp_path / "ok.lock", {"alpha": GOOD})
    with pytest.raises(LockError, match="ok.lock: unknown component.*nosuch"):
        load_lock(p).select(["nosuch"])


def test_cli_reports_a_bad_lock_in_one_line(tmp_path):
    bad = tmp_path / "bad.lock"
    bad.write_text("schema = 1\n[components.a]\npackage = 'a'\n")
    r = run_setup("--verify", lock=bad, root=tmp_path)
    assert r.rc == 2
    assert "Traceback" not in r.text
    assert "bad.lock" in r.err and "components.a" in r.err
    r = run_setup("--verify", "--only", "nosuch", lock=write_lock(tmp_path / "ok.lock", {"alpha": GOOD}), root=tmp_path)
    assert r.rc == 2 and "nosuch" in r.err and "Traceback" not in r.text


# --------------------------------------------------------------------------- rewrite_tree_hash


def test_rewrite_tree_hash_changes_one_line_and_keeps_comments(tmp_path):
    lock_copy = tmp_path / "sources.lock"
    shutil.copyfile(LOCK, lock_copy)
    before = lock_copy.read_text().splitlines()
    new = "c" * 64
    assert rewrite_tree_hash(lock_copy, "verl", "pypi", new) is True
    after = lock_copy.read_text().splitlines()
    assert len(after) == len(before)
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert changed == [(f'pypi = "{load_lock(LOCK).components["verl"].tree_sha256["pypi"]}"', f'pypi = "{new}"')]
    assert [ln for ln in after if ln.startswith("#")] == [ln for ln in before if ln.startswith("#")]
    assert load_lock(lock_copy).components["verl"].tree_sha256 == {
        "git": load_lock(LOCK).components["verl"].tree_sha256["git"],
        "pypi": new,
    }
    # unchanged value: no write at all
    mtime = lock_copy.stat().st_mtime_ns
    assert rewrite_tree_hash(lock_copy, "verl", "pypi", new) is False
    assert lock_copy.stat().st_mtime_ns == mtime


def test_rewrite_tree_hash_in_the_last_table_and_adding_a_route(tmp_path):
    lock_copy = tmp_path / "sources.lock"
    shutil.copyfile(LOCK, lock_copy)
    assert rewrite_tree_hash(lock_copy, "mindspeed_llm", "git", "d" * 64)
    relocked, committed = load_lock(lock_copy).components, load_lock(LOCK).components
    assert relocked["mindspeed_llm"].tree_sha256 == {"git": "d" * 64}
    assert relocked["mindspeed"].tree_sha256 == committed["mindspeed"].tree_sha256

    comp = dict(GOOD, tree_sha256={})
    p = write_lock(tmp_path / "t.lock", {"alpha": comp, "beta": dict(GOOD, package="beta", tree_sha256={})})
    assert rewrite_tree_hash(p, "alpha", "git", "e" * 64)
    lock = load_lock(p)
    assert lock.components["alpha"].tree_sha256 == {"git": "e" * 64}
    assert lock.components["beta"].tree_sha256 == {}
    assert "# test lock" in p.read_text()
    with pytest.raises(LockError, match=r"t.lock: no \[components.gamma.tree_sha256\]"):
        rewrite_tree_hash(p, "gamma", "git", "e" * 64)


def test_vendored_folders_are_git_ignored():
    lock = load_lock(LOCK)
    for c in lock.components.values():
        proc = subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "-q", f"{c.package}/x.py"])
        assert proc.returncode == 0, f"{c.package}/ is not git-ignored"
    for name in (".sources_state.json", ".sources_build/x"):
        assert subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "-q", name]).returncode == 0, name


def test_help_lists_the_options():
    r = run_setup("--help")
    assert r.rc == 0
    for opt in (
        "--route",
        "--cache",
        "--export-cache",
        "--mirror",
        "--index-url",
        "--only",
        "--verify",
        "--audit",
        "--force",
        "--relock",
        "--offline",
        "--lock",
        "--root",
        "auto",
        "exit status",
    ):
        assert opt in r.out, opt
