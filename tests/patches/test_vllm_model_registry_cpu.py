"""`cpu.vllm.model_registry.inspect_in_process`: on a CPU host vLLM inspects vllm-ascend's DeepSeek-V3 class
(registered by name) in the process that asks, without starting a new interpreter, and gets what upstream's
new interpreter returns for it (every interface flag, the class name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARCH = "DeepseekV3ForCausalLM"
PROBE = r"""
import dataclasses, json, subprocess, sys
import verl_patches.prelude_patch
from vllm import ModelRegistry
from vllm.model_executor.models import registry

started = []
real_run = subprocess.run
subprocess.run = lambda *a, **k: started.append(a[0] if a else k.get("args")) or real_run(*a, **k)
model = ModelRegistry.models[sys.argv[1]]
ours, arch = ModelRegistry.inspect_model_cls([sys.argv[1]])
ours_started = list(started)
# the reference: upstream's own inspection, in its new interpreter
upstream = registry._run_in_subprocess(lambda: registry._ModelInfo.from_model_cls(model.load_model_cls()))
print("RESULT " + json.dumps({
    "lazy": type(model).__name__, "arch": arch, "ours": dataclasses.asdict(ours),
    "upstream": dataclasses.asdict(upstream), "ours_started": ours_started, "reference_started": started,
}))
"""


@pytest.mark.slow  # the reference is upstream's inspection in a new interpreter that imports vLLM again
@pytest.mark.timeout(300)
def test_a_model_registered_by_name_is_inspected_in_process_as_upstream_inspects_it() -> None:
    from verl_patches.patching.ray_runtime import worker_pythonpath

    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_PATCHES_")}
    env.update(PYTHONPATH=worker_pythonpath(), VERL_PATCHES_QUIET="1")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, ARCH], cwd=REPO, env=env, capture_output=True, text=True, timeout=280
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(line[len("RESULT ") :])
    assert out["lazy"] == "_LazyRegisteredModel", out  # vllm-ascend's class is registered by name
    assert out["ours_started"] == [], out  # no new interpreter
    assert len(out["reference_started"]) == 1, out  # the reference did start one
    assert out["ours"] == out["upstream"], out
    assert out["arch"] == ARCH and out["ours"]["is_text_generation_model"] and out["ours"]["supports_pp"], out
