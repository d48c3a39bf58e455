"""Regression: once the torch_npu CPU emulation is imported (it is, in every worker that imports
transformers, accelerate or vllm-ascend), torch.distributed.barrier() on a gloo group still works
(it failed with "Please register PrivateUse1HooksInterface" and stopped the FSDP path at worker start)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
import verl_patches.prelude_patch
import torch, torch.distributed as dist
import torch_npu
assert getattr(torch_npu, "VERL_PATCHES_CPU_EMULATION", False)
dist.init_process_group("gloo")
dist.barrier()
t = torch.ones(2); dist.all_reduce(t)
print("BARRIER-OK", torch._C._get_accelerator().type, dist.get_backend())
"""


@pytest.mark.timeout(120)
def test_gloo_barrier_after_the_emulated_torch_npu_is_imported() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert "BARRIER-OK npu gloo" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
