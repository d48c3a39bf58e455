"""The stand-in packages: installed only on a CPU host, importable in a fresh interpreter (as MindSpeed
and Ray workers import them), device calls map to the CPU, the audit report lists every op and limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from verl_patches import npu_emulation
from verl_patches.npu_emulation import builder_ops, catalog

REPO = Path(__file__).resolve().parents[2]


def run_fresh(code: str, **env: str) -> dict:
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VERL_PATCHES_DEVICE")}
    full_env.update({"PYTHONPATH": str(REPO), "VERL_PATCHES_QUIET": "1", **env})
    with tempfile.TemporaryDirectory() as tmp:  # a file, not -c: TorchScript needs the source
        script = Path(tmp) / "probe.py"
        script.write_text(code)
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=full_env, cwd=REPO, timeout=120
        )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_prelude_installs_the_stand_in_on_a_cpu_host_and_device_stays_cpu():
    res = run_fresh(
        "import json, os, sys\n"
        "import verl_patches.prelude_patch\n"
        "from verl_patches import npu_emulation\n"
        "from verl_patches.device import device_kind\n"
        "import torch, torch_npu\n"
        "print(json.dumps({'active': npu_emulation.is_active(), 'device': device_kind(),\n"
        "  'file': torch_npu.__file__, 'pp': os.environ['PYTHONPATH'].split(os.pathsep)[0],\n"
        "  'npu_dev': str(torch.device('npu')), 'avail': torch.npu.is_available(),\n"
        "  'soc': torch_npu._C._npu_get_soc_version(),\n"
        "  'verl_device': __import__('verl.utils.device', fromlist=['x']).get_device_name()}))\n"
    )
    assert res["active"] and res["device"] == "cpu" and res["verl_device"] == "cpu"
    assert Path(res["file"]).is_relative_to(npu_emulation.SITE_DIR)
    assert res["pp"] == str(npu_emulation.SITE_DIR)  # children (Ray workers, vLLM's subprocess) see it too
    assert res["npu_dev"] == "npu" and res["avail"] is False and 250 <= res["soc"] <= 255


def test_not_installed_when_the_host_is_not_a_cpu_host():
    res = run_fresh(
        "import json, sys\n"
        "from verl_patches import npu_emulation\n"
        "ok = npu_emulation.install_on_cpu_host()\n"
        "print(json.dumps({'ok': ok, 'on_path': str(npu_emulation.SITE_DIR) in sys.path}))\n",
        VERL_PATCHES_DEVICE="npu",
    )
    assert res == {"ok": False, "on_path": False}


def test_a_real_torch_npu_wins(tmp_path):
    real = tmp_path / "torch_npu"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    res = run_fresh(
        "import json\n"
        "from verl_patches import npu_emulation\n"
        "print(json.dumps({'real': npu_emulation.real_torch_npu_installed(),\n"
        "  'ok': npu_emulation.install_on_cpu_host()}))\n",
        PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}",
    )
    assert res == {"real": True, "ok": False}


def test_install_is_idempotent(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setenv("VERL_PATCHES_DEVICE", "cpu")
    assert npu_emulation.install_on_cpu_host() and npu_emulation.install_on_cpu_host()
    assert sys.path.count(str(npu_emulation.SITE_DIR)) == 1
    assert os.environ["PYTHONPATH"].split(os.pathsep).count(str(npu_emulation.SITE_DIR)) == 1


def test_transfer_to_npu_maps_cuda_and_npu_onto_the_cpu():
    res = run_fresh(
        "import json\n"
        "import verl_patches.prelude_patch\n"
        "import torch\n"
        "from torch_npu.contrib import transfer_to_npu\n"
        "a = torch.zeros(2, device='cuda'); b = torch.empty(3, device=torch.cuda.current_device())\n"
        "c = torch.ones(1).cuda(); d = torch.arange(3).to('npu:0'); m = torch.nn.Linear(2, 2).cuda()\n"
        "torch.cuda.manual_seed(3); s = torch.cuda.get_rng_state(); x1 = torch.rand(2)\n"
        "torch.cuda.set_rng_state(s); x2 = torch.rand(2)\n"
        "h = torch.histc(torch.tensor([0, 1, 1, 3]), bins=4, min=0, max=4)\n"
        "def plus_one(x: torch.Tensor) -> torch.Tensor:\n"
        "    return torch.ones_like(x) + x\n"
        "f = torch.jit.script(plus_one)  # scripting still sees the aten op behind the wrapper\n"
        "print(json.dumps({'devs': [str(t.device) for t in (a, b, c, d, m.weight)], 'rng': torch.equal(x1, x2),\n"
        "  'type': torch.zeros(1).bfloat16().type(), 'histc': h.tolist(), 'hdtype': str(h.dtype),\n"
        "  'script': f(torch.zeros(2)).tolist()}))\n"
    )
    assert res["devs"] == ["cpu"] * 5
    assert res["rng"] and res["type"] == "torch.cuda.BFloat16Tensor"
    assert res["histc"] == [1, 2, 0, 1] and res["hdtype"] == "torch.int64"
    assert res["script"] == [1.0, 1.0]


def test_every_builder_op_and_catalog_entry_resolves():
    for name in builder_ops.BUILDER_OPS:
        ns = builder_ops.emulated_ops(name)
        assert all(callable(getattr(ns, a)) for a in builder_ops.BUILDER_OPS[name])
    with pytest.raises(builder_ops.UnemulatedBuilderError, match="npu_ffn"):
        builder_ops.emulated_ops("npu_ffn")
    for op in catalog.OPS:
        module, _, fn = op.implementation.partition(":")
        assert callable(getattr(__import__(module, fromlist=[fn]), fn)), op.name


def test_emulation_report_lists_ops_and_cpu_limits():
    rep = npu_emulation.emulation_report()
    names = {o["name"] for o in rep["emulated_ops"]}
    for must in (
        "torch_npu.npu_rms_norm",
        "torch_npu.npu_fusion_attention",
        "torch_npu.npu_swiglu",
        "mindspeed npu_rotary_position_embedding",
        "mindspeed npu_moe_token_permute",
        "mindspeed npu_moe_token_unpermute",
        "mindspeed npu_gmm / npu_gmm_v2",
        "mindspeed npu_groupmatmul_add_fp32",
        "torch_npu.npu_apply_adam_w",
    ):
        assert must in names
    assert all(lim["reason"] for lim in rep["cpu_limits"]) and len(rep["cpu_limits"]) >= 5
    json.dumps(rep)


def test_ray_workers_get_the_stand_in_through_the_runtime_env():
    res = run_fresh(
        "import json, os\n"
        "import verl_patches.prelude_patch  # the trainer entry does this before starting Ray\n"
        "from verl_patches.patching.ray_runtime import runtime_env\n"
        "env = runtime_env()\n"
        "print(json.dumps({'pp': env['env_vars']['PYTHONPATH'].split(os.pathsep),\n"
        "  'hook': env['worker_process_setup_hook']}))\n"
    )
    assert str(npu_emulation.SITE_DIR) in res["pp"] and str(REPO) in res["pp"]
    assert res["hook"] == "verl_patches.prelude_patch.activate"  # which installs it again in the worker


def test_pinned_host_copy_of_a_device_tensor_is_a_copy():
    """`.cpu().pin_memory()` is how verl keeps a host copy before freeing device storage (Megatron param
    offload): with the device being the host, `.cpu()` is the tensor itself, so pinning must copy (as torch's
    pin_memory does for an unpinned tensor) or freeing the device storage loses the host copy too."""
    res = run_fresh(
        "import json\n"
        "import verl_patches.prelude_patch\n"
        "import torch\n"
        "from torch_npu.contrib import transfer_to_npu\n"
        "dev = torch.arange(4.0).cuda(); host = dev.cpu().pin_memory(); size = dev.untyped_storage().size()\n"
        "dev.untyped_storage().resize_(0)\n"
        "print(json.dumps({'host': host.tolist(), 'host_bytes': host.untyped_storage().size(), 'bytes': size}))\n"
    )
    assert res["host"] == [0.0, 1.0, 2.0, 3.0] and res["host_bytes"] == res["bytes"] == 16
