"""Launch the ranks of tests/checkpoint/actor_job.py as separate processes and kill them like a cluster does.

The ranks run under the one multi-rank harness (`verl_patches.multirank.run_rank_scripts`), told to act as a
cluster: a rank that dies takes the job down at once (as Ray fails the job when a worker dies: the remaining
ranks are SIGKILLed), and when a rank writes ``<root>/.kill_job`` every rank is SIGKILLed at once (the whole
job killed). Everything runs on 127.0.0.1 under one deadline; a rank still running at it is named with its
stacks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from verl_patches.multirank import run_rank_scripts

JOB = Path(__file__).resolve().parent / "actor_job.py"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class JobResult:
    returncodes: list[int]
    outputs: list[str]
    killed_by_harness: str  # "", "peer died", "whole job"

    @property
    def text(self) -> str:
        return "\n".join(
            f"--- rank {r} (rc {rc}) ---\n{out[-3000:]}"
            for r, (rc, out) in enumerate(zip(self.returncodes, self.outputs))
        )


def launch(
    world: int, root: Path, args: list[str], kill: str = "", launch_id: str = "", timeout_s: float = 400
) -> JobResult:
    env = {
        "CKPT_TEST_KILL": kill,
        "CKPT_TEST_LAUNCH": launch_id,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    marker = root / ".kill_job"
    runs = run_rank_scripts(
        JOB,
        world,
        timeout_s,
        args=["--root", str(root), *args],
        rank_env=[env] * world,
        cwd=REPO,
        check=False,  # the test kills ranks on purpose: their ends are its data
        peer_grace_s=0,
        stop=marker.exists,
    )
    how = ""
    if marker.exists():
        how = "whole job"
        marker.unlink()
    elif any(run.status != 0 for run in runs):
        # A rank ended on its own with an error (the one the test killed, or a peer that saw it go and exited
        # before the harness ended it): the job is over, as a cluster's would be.
        how = "peer died"
    return JobResult([run.status for run in runs], [run.output for run in runs], how)
