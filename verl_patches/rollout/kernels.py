"""vllm-ascend's compiled kernels (`vllm_ascend.vllm_ascend_C` and its kernel library), built once on an
A3 host from the pinned sdist, outside the vendored `vllm_ascend/` folder (so `--verify` stays clean).

  python -m verl_patches.rollout.kernels check            what a build needs and what is missing
  python -m verl_patches.rollout.kernels build [--into DIR]

`build` unpacks the lock's sdist (sha256-checked; the file setup_sources.sh downloaded) into a temporary
folder, runs `pip wheel --no-deps --no-build-isolation` with COMPILE_CUSTOM_KERNELS=1, and copies only
the compiled files of the wheel (`*.so` under vllm_ascend/) into DIR (default: `vllm_ascend_kernels/` in
the environment's site-packages). Nothing else of the wheel is installed: the Python code stays the
vendored folder. The declared patch `npu.vllm_ascend.vllm_ascend_C` then makes
`import vllm_ascend.vllm_ascend_C` load the built extension from there (kernels_loader.py).
A missing prerequisite (CANN toolkit, compiler, cmake, torch_npu, pybind11, Python headers) is one
error naming it and how to provide it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

from verl_patches.base.atomic_write import swap_folder_in, temp_dir_for
from verl_patches.sources.errors import SourceError
from verl_patches.sources.lock import load_lock
from verl_patches.sources.paths import user_cache_dir
from verl_patches.sources.pypi_route import cached_artifact, fetch_artifact, sha256_file

KERNEL_DIR_NAME = "vllm_ascend_kernels"
EXTENSION = "vllm_ascend_C"
DEFAULT_SOC = "ascend910_9391"  # Atlas A3 (vllm-ascend's SOC_VERSION name for the 910C dies)
REPO_ROOT = Path(__file__).resolve().parents[2]


# The pinned sdist's [build-system] requires that requirements.txt does not pin, and why none is needed:
# `pip wheel --no-build-isolation` installs nothing, so every other name of that list must be a pin there
# (tests/rollout/test_kernel_build_requirements.py reads the list from the sdist and checks both).
BUILD_REQUIRES_WITHOUT_PIN: dict[str, str] = {
    "pip": "the installer that runs the build",
    "wheel": "setuptools >= 70.1 builds wheels itself (requirements.txt pins setuptools 79.0.1)",
    "packaging": "a dependency of setuptools-scm (requirements.txt), installed with it",
}


class KernelBuildError(RuntimeError):
    pass


def default_kernel_dir() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / KERNEL_DIR_NAME


def missing_prerequisites(
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    module_exists: Callable[[str], bool] | None = None,
    path_exists: Callable[[Path], bool] = Path.exists,
) -> list[str]:
    """Every prerequisite of the build that this host lacks, each with how to provide it ([] = ready)."""

    env = os.environ if environ is None else environ
    has_module = module_exists or (lambda m: importlib.util.find_spec(m) is not None)
    out = []
    cann = env.get("ASCEND_HOME_PATH") or env.get("ASCEND_TOOLKIT_HOME")
    if not cann:
        out.append("CANN toolkit: ASCEND_HOME_PATH is not set (source /usr/local/Ascend/ascend-toolkit/set_env.sh)")
    elif not path_exists(Path(cann)):
        out.append(f"CANN toolkit: ASCEND_HOME_PATH={cann} does not exist")
    for tool, why in (
        ("cmake", "cmake >= 3.26 (pip install cmake)"),
        ("g++", "a C++17 compiler (gcc-c++)"),
        ("gcc", "a C compiler (gcc)"),
    ):
        if which(tool) is None:
            out.append(f"{tool}: not on PATH; install {why}")
    for module, why in (
        ("torch_npu", "torch-npu==2.5.1.post1 (requirements.txt)"),
        ("pybind11", "pybind11 (requirements.txt)"),
        ("setuptools_scm", "setuptools-scm==8.3.1 (requirements.txt)"),
    ):
        if not has_module(module):
            out.append(f"{module}: not importable; install {why}")
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not path_exists(include):
        out.append(f"Python headers: {include} is missing (install python3-devel)")
    return out


def build_requirements(pyproject_text: str) -> list[str]:
    """The canonical names in a pyproject.toml's ``[build-system] requires`` (versions and markers dropped)."""

    try:
        # probe: tomllib is standard from Python 3.11; on 3.10 tomli reads the toml
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomli comes with setuptools-scm there
        # probe: tomllib is standard from Python 3.11; on 3.10 tomli reads the toml
        import tomli as tomllib  # type: ignore[no-redef]

    requires = tomllib.loads(pyproject_text).get("build-system", {}).get("requires", [])
    return [
        re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r.strip()).group(0)).lower() for r in requires
    ]


def compiled_members(wheel: Path) -> list[str]:
    """The compiled files of a built vllm-ascend wheel: shared objects under vllm_ascend/ (nothing else)."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith("vllm_ascend/") and ".so" in Path(n).name]
    if not any(Path(n).name.startswith(EXTENSION) for n in names):
        raise KernelBuildError(f"{wheel.name} holds no {EXTENSION} extension: was COMPILE_CUSTOM_KERNELS=1 honoured?")
    return sorted(names)


def install_members(wheel: Path, members: list[str], into: Path) -> list[Path]:
    """Copy the compiled files flat into `into` (atomically: a temporary folder renamed into place)."""
    into.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_for(into)
    try:
        with zipfile.ZipFile(wheel) as z:
            for name in members:
                target = tmp / Path(name).name
                target.write_bytes(z.read(name))
                target.chmod(0o755)
        swap_folder_in(tmp, into, into.with_name(f".{into.name}.old.{os.getpid()}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(into.iterdir())


def pinned_sdist() -> Path:
    comp = load_lock(REPO_ROOT / "sources.lock").components["vllm_ascend"]
    assert comp.pypi is not None
    path = cached_artifact(user_cache_dir(), comp.pypi)
    if not path.is_file():  # set up from git or an exported cache: fetch the sdist (sha256-checked)
        try:
            path, _ = fetch_artifact(comp.pypi, user_cache_dir())
        except SourceError as e:
            raise KernelBuildError(
                f"{comp.pypi.file} is neither in the download cache nor downloadable ({e}); copy it into {path.parent}"
            ) from None
    if sha256_file(path) != comp.pypi.sha256:
        raise KernelBuildError(f"{path}: sha256 differs from sources.lock's {comp.pypi.sha256}")
    return path


def build(into: Path, soc_version: str = DEFAULT_SOC) -> list[Path]:
    missing = missing_prerequisites()
    if missing:
        raise KernelBuildError("cannot build vllm-ascend's kernels here:\n  " + "\n  ".join(missing))
    sdist = pinned_sdist()
    with tempfile.TemporaryDirectory(prefix="vllm_ascend_kernels.") as work:
        shutil.unpack_archive(str(sdist), work)
        (src,) = [p for p in Path(work).iterdir() if p.is_dir()]
        env = dict(os.environ, COMPILE_CUSTOM_KERNELS="1", SOC_VERSION=soc_version)
        wheel_dir = Path(work) / "wheel"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheel_dir),
            str(src),
        ]
        p = subprocess.run(cmd, env=env, cwd=work)
        if p.returncode != 0:
            raise KernelBuildError(
                f"building vllm-ascend's kernels failed (pip wheel exit {p.returncode}); the compiler output is above"
            )
        (wheel,) = wheel_dir.glob("vllm_ascend-*.whl")
        return install_members(wheel, compiled_members(wheel), into)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_patches.rollout.kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("check", "build"))
    ap.add_argument(
        "--into", type=Path, default=None, help=f"install folder (default: site-packages/{KERNEL_DIR_NAME})"
    )
    ap.add_argument("--soc-version", default=DEFAULT_SOC)
    args = ap.parse_args(argv)
    if args.command == "check":
        missing = missing_prerequisites()
        print("ready to build vllm-ascend's kernels" if not missing else "missing:\n  " + "\n  ".join(missing))
        return 1 if missing else 0
    try:
        files = build(args.into or default_kernel_dir(), args.soc_version)
    except KernelBuildError as e:
        print(f"vllm-ascend kernels: {e}", file=sys.stderr)
        return 1
    print("installed: " + ", ".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
