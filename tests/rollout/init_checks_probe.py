"""Fresh interpreter (argv: JSON file with {"rollout": <resolved rollout config>, "cases": {...}}): verl's
vLLMRollout.__init__ as upstream wrote it and as our F1 patch derives it, on the same inputs, with vLLM's
`LLM` replaced by a recorder. Prints one JSON line: per case and per variant, the outcome."""

import json
import sys
import traceback

import verl_patches.prelude_patch  # noqa: F401  (what every job process runs first)

# isort: split
import torch.distributed as dist  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from verl_patches.base.free_port import free_port  # noqa: E402

port = free_port()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

from verl.workers.rollout.vllm_rollout import vllm_rollout_spmd  # noqa: E402

spec = json.load(open(sys.argv[1]))
received: list[dict] = []


class RecordingLLM:
    def __init__(self, **kwargs):
        received.append(
            {k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool, dict, list, type(None)))}
        )

    def sleep(self, level=1):
        pass


vllm_rollout_spmd.LLM = RecordingLLM
patched = vllm_rollout_spmd.vLLMRollout.__init__
chain = [patched]
while hasattr(chain[-1], "__wrapped__"):
    chain.append(chain[-1].__wrapped__)
variants = {"upstream": chain[-1], "patched": patched}
out = {"dropped_checks": list(getattr(patched, "dropped_checks", ())), "cases": {}}


class HFConfig:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


for name, case in spec["cases"].items():
    config = OmegaConf.merge(OmegaConf.create(spec["rollout"]), case.get("rollout", {}))
    hf = HFConfig(**case.get("hf", {"max_position_embeddings": 163840, "rope_scaling": None}))
    out["cases"][name] = {}
    for variant, init in variants.items():
        received.clear()
        obj = vllm_rollout_spmd.vLLMRollout.__new__(vllm_rollout_spmd.vLLMRollout)
        try:
            init(obj, "/model", config, type("T", (), {"pad_token_id": 0})(), hf)
            result = {
                "ok": True,
                "llm": received[-1] if received else None,
                "sampling": {k: getattr(obj.sampling_params, k) for k in ("temperature", "top_k", "top_p", "n")},
            }
        except Exception as e:  # noqa: BLE001  (the outcome is the data)
            tb = traceback.extract_tb(e.__traceback__)[-1]
            result = {
                "ok": False,
                "error": type(e).__name__,
                "message": str(e)[:200],
                "file": tb.filename,
                "line": tb.lineno,
            }
        out["cases"][name][variant] = result
print(json.dumps(out))
