"""The driver's import chain on requirements.txt's torch (2.5.1): verl's TaskRunner imports
`verl.utils.vllm_utils`, which imports vLLM's DeepSeek model, its fused MoE and fp8 utilities; there
`direct_register_custom_op` hands torch 2.5.1's `infer_schema` a `list[int]` annotation, which it refuses
with ValueError unless vllm-ascend's general plugin has replaced the registration first. The declared patch
`vllm.general_plugins_at_import` loads vLLM's general plugins the moment `import vllm` completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What the driver and verl's TaskRunner import, in their order (main_ppo_npu, then TaskRunner.run).
DRIVER_CHAIN = r"""
import json, sys
if sys.argv[1] == "prelude":
    import verl_patches.prelude_patch
else:  # the control: the same host (the emulated torch_npu vllm-ascend's platform needs), none of our patches
    from verl_patches.npu_emulation import install_on_cpu_host
    install_on_cpu_host()
import torch
import verl.trainer.main_ppo
try:
    from verl.utils.vllm_utils import is_version_ge  # TaskRunner.run's "vllm early verify"
    import verl.utils.vllm_utils as vu
    import vllm.utils
    result = {"ok": True, "moe_models": [c.__name__ for c in vu.SUPPORTED_MOE_MODELS],
              "registrar": vllm.utils.direct_register_custom_op.__module__}
except Exception as e:
    result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
result["torch"] = torch.__version__
print("RESULT " + json.dumps(result))
"""


def _driver(mode: str) -> dict:
    from verl_patches.patching.ray_runtime import worker_pythonpath

    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_PATCHES_")}
    env.update(PYTHONPATH=worker_pythonpath(), VERL_PATCHES_QUIET="1")  # what the launcher gives the driver
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER_CHAIN, mode], cwd=REPO, env=env, capture_output=True, text=True, timeout=280
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[len("RESULT ") :])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_driver_import_chain_passes_on_torch_2_5_1_with_the_prelude_and_fails_without() -> None:
    from verl_patches.sources.pins import read_pins

    with_prelude, without = _driver("prelude"), _driver("emulation-only")
    pinned = read_pins()["torch"].version
    assert with_prelude["torch"].split("+")[0] == pinned == "2.5.1", with_prelude
    assert with_prelude["ok"], with_prelude
    assert with_prelude["registrar"].startswith("vllm_ascend."), with_prelude
    assert "DeepseekV3ForCausalLM" in with_prelude["moe_models"], with_prelude
    # the same chain without our patch is the crash the tiny run had in the driver: this test sees it
    assert not without["ok"] and "infer_schema" in without["error"] and "list[int]" in without["error"], without
