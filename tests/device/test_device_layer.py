"""verl_patches.device: the one place that talks to torch.cuda / torch.npu. NPU branch via fakes."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

from tests.patching.patching_testlib import REPO
from verl_patches import device
from verl_patches.base.host_device import DEVICE_ENV, STALE_DEVICE_ENV


@pytest.fixture(autouse=True)
def fresh_device_kind(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.delenv(STALE_DEVICE_ENV, raising=False)
    monkeypatch.delenv("PYTORCH_NPU_ALLOC_CONF", raising=False)
    device.device_kind.cache_clear()
    yield
    device.device_kind.cache_clear()


class FakeAccelerator(types.SimpleNamespace):
    """Records which leaf calls the device layer makes."""

    def __init__(self, with_virt_cache: bool = True):
        super().__init__(calls=[])
        if with_virt_cache:
            self.empty_virt_addr_cache = lambda: self.calls.append("empty_virt_addr_cache")

    def empty_cache(self):
        self.calls.append("empty_cache")

    def synchronize(self):
        self.calls.append("synchronize")

    def mem_get_info(self):
        self.calls.append("mem_get_info")
        return 3 << 30, 64 << 30


def force(monkeypatch, kind: str, fake: FakeAccelerator | None = None) -> None:
    monkeypatch.setenv(DEVICE_ENV, kind)
    device.device_kind.cache_clear()
    if fake is not None:
        monkeypatch.setattr(device, "_npu_module" if kind == "npu" else "_cuda_module", lambda: fake)


def test_detects_cpu_here_and_honours_the_override(monkeypatch):
    assert device.device_kind() == "cpu"  # no torch_npu, no GPU on the test hosts
    for kind in ("npu", "cuda", "cpu"):
        force(monkeypatch, kind)
        assert device.device_kind() == kind


def test_invalid_override_is_a_clear_error(monkeypatch):
    force(monkeypatch, "gpu")
    with pytest.raises(ValueError, match=r"VERL_PATCHES_DEVICE='gpu': expected npu, cuda or cpu"):
        device.device_kind()


def test_the_former_variable_name_is_refused_with_the_name_to_use(monkeypatch):
    monkeypatch.setenv(STALE_DEVICE_ENV, "cpu")
    device.device_kind.cache_clear()
    with pytest.raises(ValueError, match=r"VERL_OVERLAY_DEVICE='cpu': .*set VERL_PATCHES_DEVICE=cpu"):
        device.device_kind()


def test_detects_npu_from_an_installed_torch_npu_without_importing_it(monkeypatch):
    import importlib.util
    import sys

    # an earlier test in this process may have imported our CPU emulation: what matters is that detection
    # itself imports nothing
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "torch_npu" else real(name, *a)
    )
    assert device.device_kind() == "npu"
    assert "torch_npu" not in sys.modules


@pytest.mark.parametrize("kind, backend", [("npu", "hccl"), ("cuda", "nccl"), ("cpu", "gloo")])
def test_dist_backend(monkeypatch, kind, backend):
    assert device.dist_backend(kind) == backend
    force(monkeypatch, kind)
    assert device.dist_backend() == backend


def test_torch_device(monkeypatch):
    import torch

    assert device.torch_device() == torch.device("cpu") and device.torch_device(3) == torch.device("cpu")
    force(monkeypatch, "cuda")  # a cuda device object is constructible without a GPU (an npu one needs torch_npu)
    assert device.torch_device() == torch.device("cuda") and device.torch_device(1) == torch.device("cuda:1")


@pytest.mark.parametrize(
    "conf, expected",
    [
        ("expandable_segments:True", "empty_virt_addr_cache"),
        ("max_split_size_mb:128, expandable_segments : True", "empty_virt_addr_cache"),
        ("expandable_segments:False", "empty_cache"),
        ("", "empty_cache"),
    ],
)
def test_npu_empty_cache_prefers_virtual_address_release_in_expandable_mode(monkeypatch, conf, expected):
    fake = FakeAccelerator(with_virt_cache=True)
    force(monkeypatch, "npu", fake)
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", conf)
    assert device.empty_cache() == expected
    assert fake.calls == [expected]


def test_npu_without_virt_cache_call_falls_back_to_empty_cache(monkeypatch):
    fake = FakeAccelerator(with_virt_cache=False)
    force(monkeypatch, "npu", fake)
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    assert device.empty_cache() == "empty_cache" and fake.calls == ["empty_cache"]


def test_cuda_never_uses_the_npu_call(monkeypatch):
    fake = FakeAccelerator(with_virt_cache=True)
    force(monkeypatch, "cuda", fake)
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    assert device.empty_cache() == "empty_cache" and fake.calls == ["empty_cache"]


def test_cpu_empty_cache_and_synchronize_are_no_ops():
    assert device.accelerator_module() is None
    assert device.empty_cache() == "none"
    assert device.synchronize() is None


def test_synchronize_on_an_accelerator(monkeypatch):
    fake = FakeAccelerator()
    force(monkeypatch, "npu", fake)
    device.synchronize()
    assert fake.calls == ["synchronize"]


def test_memory_info_on_cpu_is_host_memory():
    import psutil

    info = device.memory_info()
    assert info.total_bytes == psutil.virtual_memory().total
    assert 0 < info.free_bytes <= info.total_bytes
    assert info.used_bytes == info.total_bytes - info.free_bytes
    assert info.line("x").startswith("x: used ") and "GiB" in info.line()


def test_memory_info_on_an_accelerator_uses_mem_get_info(monkeypatch):
    fake = FakeAccelerator()
    force(monkeypatch, "npu", fake)
    info = device.memory_info()
    assert (info.free_bytes, info.total_bytes, info.used_bytes) == (3 << 30, 64 << 30, 61 << 30)
    assert fake.calls == ["mem_get_info"]
    assert info.line("step") == "step: used 61.00 GiB, free 3.00 GiB, total 64.00 GiB"


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
def test_profiler_shim_on_cpu_writes_a_trace(tmp_path):
    import torch

    out = tmp_path / "prof"
    with device.profiler(str(out)) as prof:
        (torch.randn(32, 32) @ torch.randn(32, 32)).sum()
        prof.step()
    traces = list(out.iterdir())
    assert traces and all(t.name.endswith(".pt.trace.json") for t in traces)


def test_maybe_profile_disabled_is_a_no_op(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("profiler must not be built when disabled")

    monkeypatch.setattr(device, "profiler", boom)
    out = tmp_path / "never"
    with device.maybe_profile(False, str(out)) as prof:
        assert prof is None
    assert not out.exists()


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
def test_maybe_profile_enabled_profiles(tmp_path):
    import torch

    out = tmp_path / "on"
    with device.maybe_profile(True, str(out)) as prof:
        torch.ones(4).sum()
        prof.step()
    assert any(out.iterdir())


# ---- nothing else of ours talks to the accelerator modules directly ----------------------------
ALLOWED = {
    REPO / "verl_patches" / "device.py",
    REPO / "verl_patches" / "patches" / "verl" / "utils" / "device.py",
}  # the CPU device-module shim
ACCEL = {"cuda", "npu"}


def accelerator_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ACCEL
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        ):
            hits.append(f"{path}:{node.lineno}: torch.{node.attr}")
        elif isinstance(node, ast.Import):
            hits += [
                f"{path}:{node.lineno}: import {a.name}"
                for a in node.names
                if a.name in ("torch_npu", "torch.cuda", "torch.npu") or a.name.startswith("torch_npu.")
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if (
                node.module.split(".")[0] == "torch_npu"
                or node.module in ("torch.cuda", "torch.npu")
                or (node.module == "torch" and any(a.name in ACCEL for a in node.names))
            ):
                hits.append(f"{path}:{node.lineno}: from {node.module} import ...")
    return hits


def test_scan_finds_direct_calls():
    """The scan itself works (it would otherwise pass vacuously)."""
    hits = accelerator_uses(REPO / "verl_patches" / "device.py")
    assert any("torch.cuda" in h for h in hits) and any("import torch_npu" in h for h in hits)


def test_no_other_module_of_ours_calls_torch_cuda_or_npu():
    files = sorted((REPO / "verl_patches").rglob("*.py"))
    assert len(files) > 20
    emulation = REPO / "verl_patches" / "npu_emulation"  # the emulated device itself (CPU hosts only)
    offenders = [h for f in files if f not in ALLOWED and not f.is_relative_to(emulation) for h in accelerator_uses(f)]
    assert offenders == [], "call verl_patches.device instead:\n" + "\n".join(offenders)
