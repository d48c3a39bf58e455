"""In a fresh interpreter that imports what verl's TaskRunner imports, our trainer patches (A1 fused role,
A2 fit, C7 union_tensor_dict) are the objects verl calls, including through DataProto.union."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import verl_patches.prelude_patch
import torch
from tensordict import TensorDict
from verl import DataProto
import verl.protocol as protocol
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

# WRAP patches keep the original's name and module (functools.wraps): look at the code that runs
ADAPTER = "verl_patches/patches/verl/trainer/ray_trainer.py"  # hands both to verl_patches.driver
assert RayPPOTrainer.fit.__code__.co_filename.endswith(ADAPTER), RayPPOTrainer.fit.__code__
assert RayPPOTrainer.init_workers.__code__.co_filename.endswith(ADAPTER)
assert RayPPOTrainer.fit.__wrapped__.__code__.co_filename.endswith("verl/trainer/ppo/ray_trainer.py")
assert protocol.union_tensor_dict.__module__ == "verl_patches.patches.verl.protocol"
out = DataProto(batch=TensorDict({}, batch_size=[2]).lock_()).union(DataProto.from_dict({"x": torch.ones(2)}))
assert list(out.batch.keys()) == ["x"]
print("OK")
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_trainer_patches_are_active_in_a_fresh_interpreter() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-2000:] + proc.stderr[-3000:]
