"""vllm-ascend's compiled kernels: the prerequisites check names what is missing; only the compiled files of
a built wheel are installed, outside the vendored folder, atomically; the declared patch makes
`import vllm_ascend.vllm_ascend_C` find them (a stand-in module here: compiling needs CANN)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.patching.patching_testlib import run_python
from verl_patches.rollout import kernels

REPO = Path(__file__).resolve().parents[2]


def test_missing_prerequisites_are_each_named() -> None:
    missing = kernels.missing_prerequisites(
        {}, which=lambda t: None, module_exists=lambda m: False, path_exists=lambda p: False
    )
    text = "\n".join(missing)
    for needle in ("ASCEND_HOME_PATH is not set", "cmake", "g++", "gcc", "torch_npu", "pybind11", "Python headers"):
        assert needle in text
    ready = kernels.missing_prerequisites(
        {"ASCEND_HOME_PATH": "/usr/local/Ascend/ascend-toolkit/latest"},
        which=lambda t: f"/usr/bin/{t}",
        module_exists=lambda m: True,
        path_exists=lambda p: True,
    )
    assert ready == []
    bad = kernels.missing_prerequisites(
        {"ASCEND_HOME_PATH": "/nope"},
        which=lambda t: "/x",
        module_exists=lambda m: True,
        path_exists=lambda p: str(p) != "/nope",
    )
    assert bad == ["CANN toolkit: ASCEND_HOME_PATH=/nope does not exist"]


def test_build_refuses_clearly_on_this_cpu_host(capsys) -> None:
    if not kernels.missing_prerequisites():
        pytest.skip("this host can build the kernels")
    assert kernels.main(["build", "--into", "/tmp/never-written"]) == 1
    err = capsys.readouterr().err
    assert "cannot build vllm-ascend's kernels here" in err and "CANN toolkit" in err
    assert not Path("/tmp/never-written").exists()


def fake_wheel(path: Path, with_ext: bool = True) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm_ascend/__init__.py", "print('second copy')\n")
        z.writestr("vllm_ascend/platform.py", "")
        if with_ext:
            z.writestr("vllm_ascend/vllm_ascend_C.cpython-311-aarch64-linux-gnu.so", b"\x7fELF")
            z.writestr("vllm_ascend/lib/libvllm_ascend_kernels.so", b"\x7fELF")
        z.writestr("vllm_ascend-0.9.1.dist-info/METADATA", "Name: vllm_ascend\n")
    return path


def test_only_compiled_files_are_installed_outside_the_package(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "vllm_ascend-0.9.1-cp311-cp311-linux_aarch64.whl")
    members = kernels.compiled_members(wheel)
    assert members == [
        "vllm_ascend/lib/libvllm_ascend_kernels.so",
        "vllm_ascend/vllm_ascend_C.cpython-311-aarch64-linux-gnu.so",
    ]
    into = tmp_path / "site" / kernels.KERNEL_DIR_NAME
    files = kernels.install_members(wheel, members, into)
    assert [f.name for f in files] == ["libvllm_ascend_kernels.so", "vllm_ascend_C.cpython-311-aarch64-linux-gnu.so"]
    assert sorted(p.name for p in into.parent.iterdir()) == [kernels.KERNEL_DIR_NAME]  # no temp folder left
    with pytest.raises(kernels.KernelBuildError, match="no vllm_ascend_C extension"):
        kernels.compiled_members(fake_wheel(tmp_path / "empty.whl", with_ext=False))


def test_declared_patch_makes_the_extension_importable_from_the_kernel_folder(tmp_path: Path) -> None:
    (tmp_path / "vllm_ascend_C.py").write_text("LOADED_FROM = __file__\n")  # stands for the built .so
    code = """
        from verl_patches.patches.vllm_ascend.declarations import PATCHES
        from verl_patches.patching.registry import Registry
        r = Registry([p for p in PATCHES if p.name == 'npu.vllm_ascend.kernels_path'], 'npu').activate()
        import vllm_ascend, vllm_ascend.vllm_ascend_C as c
        print(r.records[0].status, c.__name__, c.LOADED_FROM)
    """
    p = run_python(code, env={"VERL_PATCHES_VLLM_ASCEND_KERNELS": str(tmp_path)}, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    status, name, where = p.stdout.split()
    assert (status, name, where) == ("applied", "vllm_ascend.vllm_ascend_C", str(tmp_path / "vllm_ascend_C.py"))
    assert not (REPO / "vllm_ascend" / "vllm_ascend_C.py").exists()
