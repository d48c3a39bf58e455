"""Saves written in the background in a real Megatron job on CPU (gloo, 2 ranks, EP2: DeepSeek-V3 MoE layers of
MindSpeed-LLM, the distributed optimizer chained over the dense DP group of 2 ranks and the experts' group of
one rank), issue 42. The same job as test_kill_resume.py (tests/checkpoint/actor_job.py), three launches:

1. foreground saves at steps 2, 4, 6: the reference;
2. background saves, each write made slow and the next step's work (1 s) run before the fence: the work ends
   before the write (they overlap), and on every rank the update waits for the write (the recorded order); the
   committed steps 2 and 4 hold the files of the foreground saves, every tensor bit for bit (the bytes differ
   only by torch.save's per-save serialization id and the digests that follow); a rank is SIGKILLed in the middle
   of step 6's background write (one file written, no record): the job dies, step 4 stays the newest committed
   step and the tracker says 4;
3. restart with background saves: one line says it resumes from step 4, steps 5 and 6 reproduce the foreground
   run's metrics exactly (tolerance 0), the run finishes with steps 6 and 8 committed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from job_harness import launch
from test_kill_resume import metrics, resume_lines
from verl_patches.checkpoint import commit

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.needs_components("mindspeed", "mindspeed_llm"),
]
BACKGROUND = ["--background", "--work-s", "1", "--slow-write-s", "0.3"]


def events(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]


def when(found: list[dict], rank: int, what: str, step: int) -> float:
    (hit,) = [e["t"] for e in found if (e["rank"], e["what"], e["step"]) == (rank, what, step)]
    return hit


def same(a: Any, b: Any, where: str) -> None:
    """``a`` and ``b`` hold the same structure and the same tensors, bit for bit."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def same_checkpoint(mine: Path, reference: Path) -> None:
    """The step folders list the same files, and every file the save wrote holds what the reference's holds (the
    rank records aside: they carry each file's digest; the root's owner tag is each root's own)."""
    files = commit.read_manifest(mine).files
    assert sorted(files) == sorted(commit.read_manifest(reference).files)
    for rel in files:
        if "/ranks/" in rel or not (rel.startswith("actor/") or rel == "trainer_state.json"):
            continue
        if rel.endswith(".pt"):
            same(torch.load(mine / rel, weights_only=True), torch.load(reference / rel, weights_only=True), rel)
        else:
            assert (mine / rel).read_bytes() == (reference / rel).read_bytes(), rel


def test_background_saves_overlap_fence_survive_a_kill_mid_write_and_resume_exactly(tmp_path: Path) -> None:
    fg_root, bg_root = tmp_path / "foreground", tmp_path / "background"
    fg = launch(2, fg_root, ["--steps", "6", "--save-freq", "2", "--keep", "3", "--ep", "2"], launch_id="fg")
    assert fg.returncodes == [0, 0], fg.text

    args = ["--steps", "8", "--save-freq", "2", "--keep", "2", "--ep", "2", *BACKGROUND]
    first = launch(2, bg_root, args, kill="1:6:write", launch_id="bg1")
    assert first.killed_by_harness == "peer died", first.text
    names = sorted(p.name for p in bg_root.iterdir() if p.is_dir())
    assert names == [".staging-global_step_6", "global_step_2", "global_step_4"], names
    assert (bg_root / "latest_checkpointed_iteration.txt").read_text() == "4"
    staged = bg_root / ".staging-global_step_6" / "actor"
    assert not (staged / "ranks" / "rank_00001.json").exists()  # killed in the middle of its write
    assert commit.find_resume(bg_root).step == 4

    found = events(bg_root)
    for step in (2, 4):
        for rank in (0, 1):
            write_done = when(found, rank, "write done", step)
            assert when(found, rank, "work done", step) < write_done  # the next step's work ran beside the write
            assert write_done <= when(found, rank, "fence passed", step)
            assert when(found, rank, "fence passed", step) < when(found, rank, "update started", step + 1)
        same_checkpoint(bg_root / f"global_step_{step}", fg_root / f"global_step_{step}")

    second = launch(2, bg_root, [*args], launch_id="bg2")
    assert second.returncodes == [0, 0], second.text
    lines = resume_lines(second)
    assert len(lines) == 1 and f"from {bg_root / 'global_step_4'} (step 4)" in lines[0], lines
    assert sorted(p.name for p in bg_root.iterdir() if p.is_dir()) == ["global_step_6", "global_step_8"]
    assert (bg_root / "latest_checkpointed_iteration.txt").read_text() == "8"
    same_checkpoint(bg_root / "global_step_6", fg_root / "global_step_6")

    m = {**metrics(fg_root), **metrics(bg_root)}
    assert sorted(m["bg1"]) == [1, 2, 3, 4, 5, 6] and sorted(m["bg2"]) == [5, 6, 7, 8]
    for step in range(1, 7):
        assert m["bg1"][step] == m["fg"][step], (step, m["fg"][step], m["bg1"][step])
    for step in (5, 6):
        assert m["bg2"][step] == m["fg"][step], (step, m["fg"][step], m["bg2"][step])
