"""Generated .dist-info folders for the vendored vLLM and vllm-ascend: read from the pinned artifacts,
visible to importlib.metadata and to vLLM's own plugin discovery, outside every upstream folder, atomic,
idempotent, and checked by --verify."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from verl_patches.sources import dist_info
from verl_patches.sources.lock import load_lock
from verl_patches.sources.paths import user_cache_dir
from verl_patches.sources.pypi_route import cached_artifact

REPO = Path(__file__).resolve().parents[2]
LOCK = load_lock(REPO / "sources.lock")


def _artifact(component: str) -> Path:
    comp = LOCK.components[component]
    path = cached_artifact(user_cache_dir(), comp.pypi)
    if not path.is_file():
        pytest.skip(f"the pinned sdist {comp.pypi.file} is not in the download cache (run setup_sources.sh)")
    return path


@pytest.fixture()
def fake_root(tmp_path: Path) -> Path:
    """A root with (empty) package folders and a state that records the real pinned sdists."""
    state = {}
    for name in ("vllm", "vllm_ascend"):
        comp = LOCK.components[name]
        (tmp_path / comp.package).mkdir()
        state[name] = {
            "route": "pypi",
            "origin_route": "pypi",
            "artifact": str(_artifact(name)),
            "subdir": comp.pypi.subdir,
        }
    (tmp_path / ".sources_state.json").write_text(json.dumps(state))
    return tmp_path


def test_entry_points_are_the_upstream_ones(fake_root: Path) -> None:
    out = dist_info.generate(fake_root, LOCK)
    assert [(o.component, o.status) for o in out] == [("vllm", "written"), ("vllm_ascend", "written")]
    dists = {d.metadata["Name"]: d for d in md.distributions(path=[str(fake_root / ".overlay_dist")])}
    assert set(dists) == {"vllm", "vllm_ascend"}
    assert all(d.version == "0.9.1" for d in dists.values())
    eps = {(e.group, e.name, e.value) for d in dists.values() for e in d.entry_points}
    assert ("vllm.platform_plugins", "ascend", "vllm_ascend:register") in eps
    assert ("vllm.general_plugins", "ascend_enhanced_model", "vllm_ascend:register_model") in eps
    assert (
        "vllm.general_plugins",
        "lora_filesystem_resolver",
        "vllm.plugins.lora_resolvers.filesystem_resolver:register_filesystem_resolver",
    ) in eps
    # Nothing lands inside an upstream folder, and RECORD lists only the metadata files.
    assert not any(list((fake_root / p).iterdir()) for p in ("vllm", "vllm_ascend"))
    for d in dists.values():
        assert all(str(f).startswith(f"{d.metadata['Name']}-0.9.1.dist-info/") for f in d.files)


def test_git_route_reader_agrees_with_the_sdist_metadata() -> None:
    """pyproject.toml + setup.py (what the git tree holds) give the same groups as the sdist's egg-info."""
    for name in ("vllm", "vllm_ascend"):
        comp = LOCK.components[name]
        top = comp.pypi.subdir.split("/")[0]
        with tarfile.open(_artifact(name)) as t:
            read = lambda member, t=t, top=top: t.extractfile(f"{top}/{member}").read()  # noqa: E731
            from_git = dist_info._merge(
                dist_info.entry_points_from_pyproject(read("pyproject.toml"), "pyproject"),
                dist_info.entry_points_from_setup_py(read("setup.py"), "setup.py"),
            )
            egg = dist_info.parse_entry_points(read(f"{comp.package}.egg-info/entry_points.txt").decode(), "egg")
        assert dist_info.render_entry_points(from_git) == dist_info.render_entry_points(egg), name


def test_second_run_is_a_no_op_and_tampering_is_reported(fake_root: Path) -> None:
    dist_info.generate(fake_root, LOCK)
    folder = fake_root / ".overlay_dist" / "vllm_ascend-0.9.1.dist-info"
    mtime = folder.stat().st_mtime_ns
    assert [o.status for o in dist_info.generate(fake_root, LOCK)] == ["unchanged", "unchanged"]
    assert folder.stat().st_mtime_ns == mtime
    assert [r["status"] for r in dist_info.report(fake_root, LOCK)] == ["match", "match"]
    (folder / "entry_points.txt").write_text("[vllm.platform_plugins]\nascend = evil:register\n")
    rows = {r["component"]: r for r in dist_info.report(fake_root, LOCK)}
    assert rows["vllm_ascend"]["status"] == "mismatch" and "differs" in rows["vllm_ascend"]["problems"][0]
    assert dist_info.exit_status(list(rows.values())) == 1
    dist_info.generate(fake_root, LOCK)  # regenerates, leaving no temporary folder behind
    assert sorted(p.name for p in (fake_root / ".overlay_dist").iterdir()) == [
        "vllm-0.9.1.dist-info",
        "vllm_ascend-0.9.1.dist-info",
    ]


def test_missing_artifact_is_one_clear_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OVERLAY_CACHE", str(tmp_path / "empty-cache"))
    (tmp_path / "vllm").mkdir()
    out = dist_info.generate(tmp_path, LOCK, ["vllm"])
    assert out[0].status == "failed" and "vllm-0.9.1.tar.gz" in out[0].detail and "--only vllm" in out[0].detail
    assert not (tmp_path / ".overlay_dist").exists()  # nothing half-written


def test_not_installed_component_is_skipped(tmp_path: Path) -> None:
    assert [o.status for o in dist_info.generate(tmp_path, LOCK)] == ["skipped", "skipped"]


def test_bad_entry_point_text_names_file_and_line() -> None:
    with pytest.raises(dist_info.DistInfoError, match=r"x\.txt:2"):
        dist_info.parse_entry_points("[g]\nno equals sign\n", "x.txt")


def test_dist_folder_is_git_ignored_and_outside_upstream_folders() -> None:
    assert "/.overlay_dist/" in (REPO / ".gitignore").read_text().splitlines()
    p = subprocess.run(["git", "check-ignore", "-q", ".overlay_dist/vllm-0.9.1.dist-info/METADATA"], cwd=REPO)
    assert p.returncode == 0
    assert dist_info.DIST_DIR_NAME not in {c.package for c in LOCK.components.values()}


def test_fresh_interpreter_with_the_launch_pythonpath_sees_vllm_and_its_plugins(fake_root: Path) -> None:
    """What every job process (and vLLM's model-inspection subprocess, which inherits PYTHONPATH) sees:
    verl's version probe works, and the entry-point query vLLM's plugin loader makes
    (vllm/plugins/__init__.py: importlib.metadata.entry_points(group=...)) lists vllm-ascend's plugins.
    That vLLM then resolves NPUPlatform through it is tested with the torch_npu emulation
    (test_platform_discovery.py)."""
    dist_info.generate(fake_root, LOCK)
    code = (
        "import importlib.metadata as m, json, sys; "
        "g = lambda n: sorted(e.name for e in m.entry_points(group=n)); "
        "print(json.dumps([m.version('vllm'), m.version('vllm_ascend'), g('vllm.platform_plugins'), "
        "g('vllm.general_plugins'), m.entry_points(group='vllm.platform_plugins')['ascend'].load().__module__, "
        "'vllm' in sys.modules]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), dist_info.path_entry(fake_root)])}
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    vllm_v, ascend_v, platforms, general, module, vllm_loaded = json.loads(p.stdout.strip().splitlines()[-1])
    assert (vllm_v, ascend_v) == ("0.9.1", "0.9.1")
    assert platforms == ["ascend"] and module == "vllm_ascend" and not vllm_loaded
    assert general == ["ascend_enhanced_model", "lora_filesystem_resolver"]


def test_launchers_put_the_metadata_on_every_process_path() -> None:
    from verl_patches.launch.job import base_env
    from verl_patches.patching.ray_runtime import runtime_env

    entry = dist_info.path_entry(REPO)
    assert entry in base_env()["PYTHONPATH"].split(os.pathsep)
    assert entry in runtime_env()["env_vars"]["PYTHONPATH"].split(os.pathsep)
