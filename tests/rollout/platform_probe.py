"""Run in a fresh interpreter (argv: tiny model dir): vllm-ascend on the torch_npu CPU emulation, found
through its real `vllm.platform_plugins` entry point, then its worker's device set-up on the emulated npu
device. Prints one JSON line."""

import json
import os
import sys
import traceback

from verl_patches.base.free_port import free_port
from verl_patches.npu_emulation import install_on_cpu_host

install_on_cpu_host()
os.environ.setdefault("VLLM_USE_V1", "1")
out: dict = {}

import importlib.metadata as md  # noqa: E402

import vllm.platforms  # noqa: E402

out["entry_points"] = sorted(f"{e.name}={e.value}" for e in md.entry_points(group="vllm.platform_plugins"))
out["qualname"] = vllm.platforms.resolve_current_platform_cls_qualname()
from vllm.platforms import current_platform  # noqa: E402

out["platform"] = f"{type(current_platform).__module__}.{type(current_platform).__name__}"
out["device_type"], out["dispatch_key"] = current_platform.device_type, current_platform.dispatch_key

from vllm.engine.arg_utils import EngineArgs  # noqa: E402

args = EngineArgs(
    model=sys.argv[1],
    tensor_parallel_size=1,
    distributed_executor_backend="external_launcher",
    enforce_eager=True,
    max_model_len=64,
    max_num_seqs=8,
    enable_prefix_caching=False,
    dtype="bfloat16",
    load_format="dummy",
    gpu_memory_utilization=0.5,
)
cfg = args.create_engine_config()  # runs NPUPlatform.check_and_update_config
out["worker_cls"] = cfg.parallel_config.worker_cls
out["block_size"] = cfg.cache_config.block_size
out["compilation_level"] = int(cfg.compilation_config.level)

port = free_port()
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
from vllm.utils import resolve_obj_by_qualname  # noqa: E402

worker = resolve_obj_by_qualname(cfg.parallel_config.worker_cls)(
    vllm_config=cfg, local_rank=0, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", is_driver_worker=True
)
try:
    worker.init_device()  # distributed groups, then the model runner and its device buffers
    out["stopped_at"] = None
    out["model_runner"] = f"{type(worker.model_runner).__module__}.{type(worker.model_runner).__qualname__}"
    out["runner_buffers_device"] = str(worker.model_runner.input_ids.device)
except Exception as e:  # where the emulation would end
    tb = traceback.extract_tb(e.__traceback__)[-1]
    out["stopped_at"] = {
        "error": type(e).__name__,
        "message": str(e).splitlines()[0][:200],
        "file": os.path.relpath(tb.filename),
        "line": tb.lineno,
    }
import torch.distributed as dist  # noqa: E402
from vllm.distributed import parallel_state as ps  # noqa: E402

out["backend"] = dist.get_backend() if dist.is_initialized() else None
out["tp_world"] = ps.get_tp_group().world_size
out["dp_world"] = ps.get_dp_group().world_size
out["ep_world"] = ps.get_ep_group().world_size
out["worker_device"] = str(worker.device)
print(json.dumps(out))
