"""The CPU device port, one declared patch at a time: each fails without its patch and works with it."""

from __future__ import annotations

import ast
import re

import pytest
import torch

from tests.patching.patching_testlib import REPO, run_json
from verl_patches.base.free_port import free_port
from verl_patches.patches.catalog import all_patches
from verl_patches.patches.verl.utils.device import CPU_DEVICE_MODULE, CpuDeviceModule, get_torch_device

CATALOG = {p.name: p for p in all_patches()}


def test_every_cpu_port_patch_is_cpu_only():
    port = [p for name, p in CATALOG.items() if name.startswith("cpu.")]
    assert len(port) >= 8
    assert all(p.devices == ("cpu",) for p in port), [p.name for p in port if p.devices != ("cpu",)]


# ---- verl.utils.device.get_torch_device ---------------------------------------------------------
def verl_device_calls() -> set[str]:
    """Every `get_torch_device().<name>` verl v0.4.0 makes."""
    names: set[str] = set()
    for path in (REPO / "verl").rglob("*.py"):
        names |= set(re.findall(r"get_torch_device\(\)\.([A-Za-z_]+)", path.read_text(encoding="utf-8")))
    return names


def test_cpu_device_module_has_every_call_verl_makes():
    calls = verl_device_calls()
    assert {"current_device", "get_rng_state", "mem_get_info", "memory_allocated"} <= calls
    missing_on_torch_cpu = {n for n in calls if not hasattr(torch.cpu, n)}
    assert missing_on_torch_cpu, "torch.cpu now has everything: the patch may be obsolete"
    assert all(hasattr(CPU_DEVICE_MODULE, n) for n in calls), [n for n in calls if not hasattr(CPU_DEVICE_MODULE, n)]


def test_cpu_device_module_calls():
    dev = get_torch_device()
    assert dev is CPU_DEVICE_MODULE and isinstance(dev, CpuDeviceModule)
    assert dev.current_device() == "cpu" and dev.get_device_name() == "cpu"
    assert dev.is_available() and dev.device_count() == 1
    assert dev.set_device(0) is None and dev.empty_cache() is None and dev.synchronize() is None
    allocated = dev.memory_allocated()
    assert allocated > 0 and dev.memory_reserved() > 0
    assert dev.max_memory_allocated() >= allocated and dev.max_memory_reserved() >= allocated
    dev.reset_peak_memory_stats()
    assert dev.max_memory_allocated() > 0  # re-sampled after the reset
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    assert dev.Stream is torch.cpu.Stream  # anything else falls through to torch.cpu


def test_cpu_device_module_rng_state_round_trip_and_seed():
    dev = get_torch_device()
    state = dev.get_rng_state()
    a = torch.rand(5)
    dev.set_rng_state(state)
    assert torch.equal(torch.rand(5), a)
    dev.manual_seed(7)
    b = torch.rand(3)
    dev.manual_seed_all(7)
    assert torch.equal(torch.rand(3), b)


# ---- verl.single_controller.ray.base.RayWorkerGroup.__init__ -----------------------------------
def test_worker_group_asks_ray_for_gpu_slots_on_cpu():
    patch = CATALOG["cpu.verl.ray_worker_group.logical_gpu_slots"]
    seen = []

    def upstream_init(self, resource_pool=None, ray_cls_with_init=None, device_name="cuda", **kwargs):
        """verl's RayWorkerGroup.__init__ (stub)."""
        seen.append((resource_pool, device_name, kwargs))

    wrapped = patch.replacement(upstream_init)  # exactly what the registry installs
    assert wrapped.__name__ == "upstream_init" and wrapped.__wrapped__ is upstream_init
    wrapped(object(), "pool", device_name="cpu", detached=True)
    wrapped(object(), "pool", device_name="npu")
    wrapped(object(), "pool")
    assert seen == [("pool", "cuda", {"detached": True}), ("pool", "npu", {}), ("pool", "cuda", {})]


def test_verl_passes_device_name_by_keyword():
    """The wrapper maps the keyword; verl's trainer must keep passing it that way."""
    tree = ast.parse((REPO / "verl" / "trainer" / "ppo" / "ray_trainer.py").read_text())
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "ray_worker_group_cls"
    ]
    assert calls and all(any(k.arg == "device_name" for k in c.keywords) for c in calls)


# ---- gloo process group, FSDP sync_module_states and CPUOffload ----------------------------------
FSDP_SCRIPT = r"""
import json, os
import torch, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.api import CPUOffload as OriginalCPUOffload
from verl_patches.patches.catalog import all_patches
from verl_patches.patching.registry import Registry

catalog = {p.name: p for p in all_patches()}
out = {}
calls = []
def upstream_init(self, config, role):
    calls.append((dist.is_initialized(), dist.get_backend() if dist.is_initialized() else None, config, role))
wrap = catalog["cpu.verl.fsdp_workers.ActorRolloutRefWorker.gloo_process_group"].replacement
worker_init = wrap(upstream_init)
try:
    worker_init(object(), "cfg", role="actor")
    group = dist.group.WORLD
    worker_init(object(), "cfg2", role="ref")              # already initialised: not again
    out["calls"] = calls
    out["same_group"] = dist.group.WORLD is group
    out["rank_world"] = [dist.get_rank(), dist.get_world_size()]

    def build(**kw):
        torch.manual_seed(0)
        return FSDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
                    device_id="cpu", **kw)

    for key, kw in (("sync_unpatched", dict(sync_module_states=True)),
                    ("offload_unpatched", dict(cpu_offload=OriginalCPUOffload(offload_params=True)))):
        try:
            build(**kw)(torch.randn(2, 4))
            out[key] = "no error"
        except Exception as e:
            out[key] = f"{type(e).__name__}: {e}"

    reg = Registry([catalog["cpu.torch.fsdp.sync_module_states_on_cpu"],
                    catalog["cpu.torch.fsdp.no_pinned_param_offload"]], "cpu").activate()
    out["statuses"] = [r.status for r in reg.records]
    m = build(sync_module_states=True)
    loss = m(torch.randn(3, 4)).square().sum()
    loss.backward()
    out["sync_patched_loss_finite"] = bool(torch.isfinite(loss))
    out["grads"] = all(p.grad is not None for p in m.parameters())
    import torch.distributed.fsdp as fsdp
    off = fsdp.CPUOffload(offload_params=True)
    out["offload"] = [off.offload_params, isinstance(off, OriginalCPUOffload),
                      fsdp.CPUOffload is not OriginalCPUOffload]
    m2 = build(cpu_offload=off)
    out["offload_forward"] = list(m2(torch.randn(2, 4)).shape)
finally:
    if dist.is_initialized():
        dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
def test_gloo_group_fsdp_sync_and_cpu_offload_on_cpu():
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "VERL_PATCHES_QUIET": "1",
    }
    out, _ = run_json(FSDP_SCRIPT, env=env, timeout=110)
    assert out["calls"] == [[True, "gloo", "cfg", "actor"], [True, "gloo", "cfg2", "ref"]]
    assert out["same_group"] and out["rank_world"] == [0, 1]
    assert "sync_module_states=True" in out["sync_unpatched"] and "CPU" in out["sync_unpatched"]
    assert out["offload_unpatched"].startswith("RuntimeError") and "accelerator" in out["offload_unpatched"]
    assert out["statuses"] == ["applied", "applied"]
    assert out["sync_patched_loss_finite"] and out["grads"]
    assert out["offload"] == [False, True, True]
    assert out["offload_forward"] == [2, 2]


# ---- transformers: flash_attention_2 → eager without flash-attn ---------------------------------
EAGER_SCRIPT = r"""
import json, tempfile, torch
from transformers import AutoModelForCausalLM, DeepseekV3Config, LlamaConfig
from verl_patches.patches.catalog import all_patches
from verl_patches.patching.registry import Registry

llama = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=2, max_position_embeddings=32)
dsv3 = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                        num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2,
                        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=8,
                        q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4,
                        max_position_embeddings=32)
out = {}
try:
    AutoModelForCausalLM.from_config(llama, attn_implementation="flash_attention_2")
    out["unpatched"] = "no error"
except Exception as e:
    out["unpatched"] = f"{type(e).__name__}: {e}"
patch = next(p for p in all_patches() if p.name == "cpu.transformers.eager_attention_without_flash_attn")
reg = Registry([patch], "cpu").activate()
out["status"] = reg.records[0].status
m = AutoModelForCausalLM.from_config(llama, attn_implementation="flash_attention_2")
out["from_config"] = m.config._attn_implementation
with tempfile.TemporaryDirectory() as d:
    m.save_pretrained(d)
    m2 = AutoModelForCausalLM.from_pretrained(d, attn_implementation="flash_attention_2", torch_dtype=torch.float32)
    out["from_pretrained"] = m2.config._attn_implementation
m3 = AutoModelForCausalLM.from_config(dsv3, attn_implementation="flash_attention_2")
out["dsv3"] = [type(m3).__name__, m3.config._attn_implementation,
               list(m3(torch.tensor([[1, 2, 3]])).logits.shape)]
out["sdpa_untouched"] = AutoModelForCausalLM.from_config(llama, attn_implementation="sdpa").config._attn_implementation
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_flash_attention_2_request_loads_eager_on_cpu():
    out, _ = run_json(EAGER_SCRIPT, env={"VERL_PATCHES_QUIET": "1"}, timeout=110)
    assert out["unpatched"].startswith("ImportError") and "flash" in out["unpatched"].lower()
    assert out["status"] == "applied"
    assert out["from_config"] == "eager" and out["from_pretrained"] == "eager"
    assert out["dsv3"] == ["DeepseekV3ForCausalLM", "eager", [1, 3, 64]]
    assert out["sdpa_untouched"] == "sdpa"


FSDP2_CHECK = r"""
import json
import verl_patches.prelude_patch
import torch
import torch.distributed._composable.fsdp
import verl.utils.device, verl.utils.fsdp_utils as fu, verl.workers.fsdp_workers as fw
policy = fu.CPUOffloadPolicy(pin_memory=True)
print(json.dumps({
    "fsdp_utils_cuda_device": fu.torch.cuda.current_device(),
    "fsdp_utils_tensor_is_torch": fu.torch.Tensor is torch.Tensor,
    "global_torch_untouched": verl.utils.device.torch is torch and torch.cuda is not fu.torch.cuda,
    "policy_pin_memory": policy.pin_memory,
    "policy_is_torch_policy": isinstance(policy, torch.distributed._composable.fsdp.CPUOffloadPolicy),
    "workers_see_same_policy": fw.CPUOffloadPolicy is fu.CPUOffloadPolicy,
}))
"""


def test_fsdp2_helpers_see_the_cpu_device_module_and_an_unpinned_offload_policy() -> None:
    """FSDP2 on CPU: verl's fsdp utils call torch.cuda directly and pin the ref policy's offload."""
    out, _ = run_json(FSDP2_CHECK)
    assert out == {
        "fsdp_utils_cuda_device": "cpu",
        "fsdp_utils_tensor_is_torch": True,
        "global_torch_untouched": True,
        "policy_pin_memory": False,
        "policy_is_torch_policy": True,
        "workers_see_same_policy": True,
    }
