"""A real local Ray cluster: a worker started with our runtime_env has every patch in place.

The driver runs in its own interpreter (so the test process never starts Ray) and always shuts Ray
down. `address="local"` starts a private cluster even when another one on this machine is
registered in /tmp/ray (ray.init() would otherwise connect to it).
"""

from __future__ import annotations

import pytest

from patching_testlib import run_json

RAY_DRIVER = r"""
import json, os, sys
import ray
from verl_patches.patching.ray_runtime import SETUP_HOOK, runtime_env

env = runtime_env()
assert env["worker_process_setup_hook"] == SETUP_HOOK
ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env=env, log_to_driver=False)
try:
    @ray.remote(num_cpus=1)
    class FsdpLikeWorker:
        def probe(self):
            out = {"pid": os.getpid(),
                   "prelude_before_worker_import": "verl_patches.prelude_patch" in sys.modules,
                   "fsdp_workers_before": "verl.workers.fsdp_workers" in sys.modules}
            import verl.workers.fsdp_workers as fw
            import verl.utils.device as vd
            import verl.single_controller.ray.base as rb
            import torch.distributed.fsdp as fsdp
            from verl_patches.patching import registry as R
            from verl_patches.patches.verl.utils.device import get_torch_device as cpu_dev
            reg = R.get_registry()
            out["manifest"] = reg.manifest()
            out["megatron_workers_loaded"] = "verl.workers.megatron_workers" in sys.modules
            out["identity"] = {
                "verl.utils.device.get_torch_device": vd.get_torch_device is cpu_dev,
                "verl.workers.fsdp_workers.get_torch_device": fw.get_torch_device is cpu_dev,
                "RayWorkerGroup.__init__": getattr(rb.RayWorkerGroup.__init__, R.MARKER, None)
                    == "cpu.verl.ray_worker_group.logical_gpu_slots",
                "ActorRolloutRefWorker.__init__": getattr(fw.ActorRolloutRefWorker.__init__, R.MARKER, None)
                    == "cpu.verl.fsdp_workers.ActorRolloutRefWorker.gloo_process_group",
                "CPUOffload": getattr(fsdp.CPUOffload, R.MARKER, None) == "cpu.torch.fsdp.no_pinned_param_offload",
                "flash_attn.bert_padding": sys.modules.get("flash_attn.bert_padding") is
                    sys.modules.get("verl_patches.patches.flash_attn.bert_padding"),
            }
            return out

    worker = FsdpLikeWorker.remote()
    result = ray.get(worker.probe.remote(), timeout=150)
    result["driver_pid"] = os.getpid()
finally:
    ray.shutdown()
print(json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_ray_worker_has_patches_in_place():
    out, _ = run_json(RAY_DRIVER, timeout=220, env={"VERL_PATCHES_QUIET": "1"})
    assert out["pid"] != out["driver_pid"]
    assert out["prelude_before_worker_import"], "the setup hook must run before any task"
    assert not out["fsdp_workers_before"] and not out["megatron_workers_loaded"]
    assert out["identity"] == {k: True for k in out["identity"]}
    statuses = {m["name"]: m["status"] for m in out["manifest"]}
    assert {m["pid"] for m in out["manifest"]} == {out["pid"]}  # the worker's own manifest
    for name in (
        "flash_attn.bert_padding.pure_torch",
        "cpu.verl.utils.device.get_torch_device",
        "cpu.verl.ray_worker_group.logical_gpu_slots",
        "cpu.torch.fsdp.no_pinned_param_offload",
        "cpu.verl.fsdp_workers.CriticWorker.gloo_process_group",
    ):
        assert statuses[name] == "applied", (name, statuses[name])
    assert statuses["apex.optimizers.module_for_npu"] == "skipped"
