"""Activation in fresh interpreters that import exactly what a Ray worker of each type imports.

Megatron workers: verl/workers/megatron_workers.py carries the inserted prelude line, so importing it
alone must activate everything. FSDP workers never load megatron_workers: Ray runs our
`worker_process_setup_hook` first, then the worker module is imported by reference.
"""

from __future__ import annotations

import pytest

from patching_testlib import run_json

# Shared by the scripts below: every applied patch is in place, and no module of the upstream trees
# (or of the target's own package) still holds the object it replaced.
CHECKS = r"""
import json, os, sys
from verl_patches.patching import registry as R

def stale_references(reg):
    bad = []
    for rec in reg.records:
        if rec.status not in ("applied", "applied-with-drift") or rec.original is R._MISSING:
            continue
        if rec.patch.kind.value in ("registry", "module-alias") or not rec.patch.rebind:
            continue  # a registry entry, an alias, or a patch declared to change one module's name only
        old = R._unwrap(rec.original)
        scope = R.UPSTREAM_ROOTS | {rec.patch.module.partition(".")[0]}
        for name, mod in list(sys.modules.items()):
            if mod is None or name.partition(".")[0] not in scope:
                continue
            for key, value in list(getattr(mod, "__dict__", {}).items()):
                if value is old:
                    bad.append(f"{name}.{key} still holds the original of {rec.patch.name}")
    return bad

def marker(obj):
    return getattr(R._unwrap(obj), R.MARKER, None)

def manifest_out(reg):
    return {"active": reg.active, "device": reg.device, "statuses": {m["name"]: m["status"] for m in reg.manifest()},
            "pids": sorted({m["pid"] for m in reg.manifest()}), "pid": os.getpid(),
            "stale": stale_references(reg)}
"""

MEGATRON_WORKER = (
    CHECKS
    + r"""
import importlib.util
import verl.workers.megatron_workers                      # nothing else: the inserted line must do it
reg = R.get_registry()
out = manifest_out(reg)
import flash_attn.bert_padding as fa
import verl_patches.patches.flash_attn.bert_padding as ours
import verl.workers.critic.dp_critic as dp_critic
from transformers.utils import is_flash_attn_2_available
out["bert_padding_is_ours"] = fa is ours and sys.modules["flash_attn.bert_padding"] is ours
out["critic_uses_ours"] = dp_critic.pad_input is ours.pad_input and dp_critic.unpad_input is ours.unpad_input
out["flash_attn_spec"] = importlib.util.find_spec("flash_attn") is not None
out["transformers_sees_flash_attn"] = is_flash_attn_2_available()
import verl.utils.device as vd
from verl_patches.patches.verl.utils.device import get_torch_device as cpu_dev
out["get_torch_device_is_cpu_module"] = vd.get_torch_device is cpu_dev
import verl.workers.fsdp_workers as fw                  # both worker modules import in one process (G1)
out["fsdp_get_torch_device"] = fw.get_torch_device is cpu_dev
out["after_fsdp"] = manifest_out(reg)
print(json.dumps(out))
"""
)


@pytest.mark.slow
def test_megatron_worker_import_alone_activates_everything():
    out, stderr = run_json(MEGATRON_WORKER)
    assert out["active"] and out["device"] == "cpu"
    assert out["pids"] == [out["pid"]]
    assert f"verl_patches active in pid {out['pid']} (device=cpu)" in stderr
    st = out["statuses"]
    assert st["flash_attn.bert_padding.pure_torch"] == "applied"
    assert st["apex.optimizers.module_for_npu"] == "skipped"
    for name in (
        "cpu.torch.fsdp.sync_module_states_on_cpu",
        "cpu.torch.fsdp.no_pinned_param_offload",
        "cpu.transformers.eager_attention_without_flash_attn",
        "cpu.verl.utils.device.get_torch_device",
    ):
        assert st[name] == "applied", name
    assert out["bert_padding_is_ours"] and out["critic_uses_ours"]
    assert out["flash_attn_spec"], "the stand-in flash_attn package needs a spec (find_spec must work)"
    assert out["transformers_sees_flash_attn"] is False, "transformers must not think flash-attn is installed"
    assert out["get_torch_device_is_cpu_module"] and out["fsdp_get_torch_device"]
    assert out["stale"] == [] and out["after_fsdp"]["stale"] == []
    after = out["after_fsdp"]["statuses"]
    assert all(
        after[f"cpu.verl.fsdp_workers.{c}.gloo_process_group"] == "applied"
        for c in ("ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker")
    )


FSDP_WORKER = (
    CHECKS
    + r"""
import importlib
from verl_patches.patching.ray_runtime import SETUP_HOOK
mod_name, fn = SETUP_HOOK.rsplit(".", 1)
getattr(importlib.import_module(mod_name), fn)()        # what Ray does with worker_process_setup_hook
reg = R.get_registry()
pending_before = {m["name"]: m["status"] for m in reg.manifest()}
import verl.workers.fsdp_workers as fw                  # what a Ray FSDP worker imports, by reference
import verl.utils.device as vd
import verl.single_controller.ray.base as rb
import torch.distributed.fsdp as fsdp
import torch.distributed.fsdp.api as fsdp_api
import transformers.modeling_utils as mu
from verl_patches.patches.verl.utils.device import get_torch_device as cpu_dev
out = manifest_out(reg)
out["pending_before"] = pending_before
out["megatron_workers_loaded"] = "verl.workers.megatron_workers" in sys.modules
out["device_fn"] = vd.get_torch_device is cpu_dev
out["fsdp_workers_copy"] = fw.get_torch_device is cpu_dev
out["worker_group_init"] = marker(rb.RayWorkerGroup.__init__)
out["worker_inits"] = {c: marker(getattr(fw, c).__init__)
                       for c in ("ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker")}
out["cpu_offload"] = [marker(fsdp.CPUOffload), fsdp.CPUOffload is fsdp_api.CPUOffload,
                      fsdp.CPUOffload(offload_params=True).offload_params]
out["autoset"] = marker(mu.PreTrainedModel.__dict__["_autoset_attn_implementation"])
# Idempotence: the hook again, the prelude import again: nothing changes, nothing is re-wrapped.
before = (vd.get_torch_device, rb.RayWorkerGroup.__init__, fw.ActorRolloutRefWorker.__init__, fsdp.CPUOffload)
import verl_patches.prelude_patch as pp
pp.activate()
getattr(importlib.import_module(mod_name), fn)()
out["idempotent"] = before == (vd.get_torch_device, rb.RayWorkerGroup.__init__, fw.ActorRolloutRefWorker.__init__,
                               fsdp.CPUOffload) and R.get_registry() is reg
print(json.dumps(out))
"""
)


@pytest.mark.slow
def test_fsdp_worker_as_ray_runs_it_gets_every_cpu_patch():
    out, stderr = run_json(FSDP_WORKER)
    assert not out["megatron_workers_loaded"], "this path must not rely on the inserted line"
    before = out["pending_before"]
    assert before["cpu.verl.utils.device.get_torch_device"] == "pending"  # activation imported no upstream code
    assert before["cpu.verl.fsdp_workers.CriticWorker.gloo_process_group"] == "pending"
    assert out["device_fn"] and out["fsdp_workers_copy"]
    assert out["worker_group_init"] == "cpu.verl.ray_worker_group.logical_gpu_slots"
    assert out["worker_inits"] == {
        c: f"cpu.verl.fsdp_workers.{c}.gloo_process_group"
        for c in ("ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker")
    }
    assert out["cpu_offload"] == ["cpu.torch.fsdp.no_pinned_param_offload", True, False]
    assert out["autoset"] == "cpu.transformers.eager_attention_without_flash_attn"
    assert out["stale"] == []
    assert out["idempotent"]
    assert stderr.count("verl_patches active in pid") == 1  # one summary line per process


UPSTREAM_FIRST = (
    CHECKS
    + r"""
import verl.workers.fsdp_workers as fw                  # upstream first: `from x import f` copies exist now
import verl.trainer.main_ppo as mp
import verl.utils.device as vd
original = vd.get_torch_device
holders_before = [n for n, m in list(sys.modules.items()) if n.startswith("verl.")
                  and getattr(m, "get_torch_device", None) is original]
import verl_patches.prelude_patch
reg = R.get_registry()
from verl_patches.patches.verl.utils.device import get_torch_device as cpu_dev
out = manifest_out(reg)
out["holders_before"] = holders_before
out["all_rebound"] = all(sys.modules[n].get_torch_device is cpu_dev for n in holders_before)
rec = next(r for r in reg.records if r.patch.name == "cpu.verl.utils.device.get_torch_device")
out["rebound_count"] = len(rec.rebound)
out["run_ppo"] = marker(mp.run_ppo)
out["loaded_but_not_applied"] = [r.patch.name for r in reg.records if r.patch.module in sys.modules
                                 and r.status not in ("applied", "skipped", "not-needed")]
print(json.dumps(out))
"""
)


@pytest.mark.slow
def test_activation_after_upstream_imports_rebinds_every_copy():
    out, _ = run_json(UPSTREAM_FIRST)
    assert "verl.workers.fsdp_workers" in out["holders_before"] and len(out["holders_before"]) >= 3
    assert out["all_rebound"]
    assert out["rebound_count"] >= len(out["holders_before"]) - 1  # all but the defining module's own slot
    assert out["stale"] == []
    assert out["run_ppo"] == "verl.main_ppo.ray_runtime_env"
    assert out["loaded_but_not_applied"] == []  # every patch whose module was loaded applied at activation
