"""Every package vllm-ascend's kernels build needs is installed by the documented routes (requirements.txt, which
the bare-metal route and the Dockerfile install): the build runs `pip wheel --no-build-isolation` on the pinned
sdist, which installs none of its own build requirements. Read from the sdist itself: its [build-system] list
and the modules its setup.py imports (setuptools_scm was missing from requirements.txt)."""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import tarfile
from pathlib import Path

import pytest

from verl_patches.rollout import kernels
from verl_patches.sources.lock import load_lock
from verl_patches.sources.paths import user_cache_dir
from verl_patches.sources.pins import canonical, read_pins

ROOT = Path(__file__).resolve().parents[2]
# a module the build imports -> the distribution that provides it (where the names differ)
MODULE_DISTRIBUTIONS = {"setuptools_scm": "setuptools-scm", "setuptools": "setuptools"}


def _sdist_member(name: str) -> str:
    comp = load_lock(ROOT / "sources.lock").components["vllm_ascend"]
    path = user_cache_dir().expanduser() / "pypi" / comp.pypi.file
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != comp.pypi.sha256:
        pytest.skip(f"{comp.pypi.file} is not in the download cache (setup_sources.sh --route pypi puts it there)")
    with tarfile.open(path) as t:
        return t.extractfile(f"vllm_ascend-{comp.pypi.version}/{name}").read().decode()


def test_every_build_system_requirement_is_pinned_or_explained() -> None:
    pins = set(read_pins(ROOT / "requirements.txt"))
    names = kernels.build_requirements(_sdist_member("pyproject.toml"))
    assert {"setuptools-scm", "cmake", "pybind11", "torch-npu"} <= set(names)
    unpinned = [n for n in names if n not in pins and n not in kernels.BUILD_REQUIRES_WITHOUT_PIN]
    assert not unpinned, f"the kernels build needs {unpinned}: pin them in requirements.txt"
    stale = [n for n in kernels.BUILD_REQUIRES_WITHOUT_PIN if n in pins or n not in names]
    assert not stale, f"BUILD_REQUIRES_WITHOUT_PIN explains {stale}, which are pinned or no longer required"


def test_every_module_setup_py_imports_is_pinned() -> None:
    tree = ast.parse(_sdist_member("setup.py"))
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    third_party = sorted(m for m in modules if m not in sys.stdlib_module_names)
    assert "setuptools_scm" in third_party
    pins = set(read_pins(ROOT / "requirements.txt"))
    missing = [m for m in third_party if canonical(MODULE_DISTRIBUTIONS.get(m, m)) not in pins]
    assert not missing, f"setup.py imports {missing}, which requirements.txt does not install"


def test_build_requirements_reads_names_without_versions_or_markers() -> None:
    text = '[build-system]\nrequires = ["cmake>=3.26", "setuptools_scm>=8", "torch-npu==2.5.1.post1", "numpy<2.0.0"]\n'
    assert kernels.build_requirements(text) == ["cmake", "setuptools-scm", "torch-npu", "numpy"]


def test_the_dockerfile_installs_the_build_tools_through_requirements_txt_only() -> None:
    """One version of each: a second `pip install cmake==...` in the image could disagree with requirements.txt."""
    text = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"pip install[^\n]*(cmake|setuptools-scm)==", text)
    pins = read_pins(ROOT / "requirements.txt")
    assert "setuptools-scm" in pins and "cmake" in pins
