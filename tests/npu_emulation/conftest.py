"""The stand-in torch_npu for the emulation's tests: one fixture, imported as the job's processes import it."""

from __future__ import annotations

import os
import sys

import pytest

from verl_patches import npu_emulation


@pytest.fixture(scope="module")
def torch_npu():
    """The stand-in torch_npu (which loads the npu device extension) and its `atb` ops, as vllm-ascend's worker
    imports them, with the emulation's site folder on the path only while importing."""
    saved_path, saved_pp = list(sys.path), os.environ.get("PYTHONPATH")
    try:
        if not npu_emulation.install_on_cpu_host():
            pytest.skip("the torch_npu stand-in installs only on a CPU host without a real torch_npu")
        import torch_npu as module
        from torch_npu.op_plugin.atb import _atb_ops  # noqa: F401
    finally:
        sys.path[:] = saved_path
        if saved_pp is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_pp
    assert getattr(module, "VERL_PATCHES_CPU_EMULATION", False)
    return module


@pytest.fixture(autouse=True)
def _cpu_proof_exceptions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels' tests compute in float32 on small shapes, as the CPU proof does: its two declared exceptions to
    the documented limits are in effect (ranks started by a test inherit them). A test of the limits themselves
    switches them off with monkeypatch.delenv."""
    from verl_patches.npu_emulation.wheel_contract.cpu_proof import EXCEPTIONS

    for exception in EXCEPTIONS:
        monkeypatch.setenv(exception.env, "1")
