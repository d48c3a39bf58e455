"""The launcher hands its run folder to the trainer (`VERL_PATCHES_RUN_DIR`), and the trainer's run-folder
lookup (`driver.rank_memory.run_dir`: resolved_config.yaml, curves.png, rank_memory.jsonl) takes it first:
a user's own TENSORBOARD_DIR, or a value left in the shell, does not move those files elsewhere."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from verl_patches.driver import rank_memory
from verl_patches.launch import job

# a stand-in for the trainer entry: what it was handed and where its run-folder files would go
TRAINER = textwrap.dedent(
    """
    import json, os, sys
    from verl_patches.driver.rank_memory import run_dir
    keys = ("VERL_PATCHES_RUN_DIR", "TENSORBOARD_DIR")
    seen = {k: os.environ.get(k) for k in keys}
    seen["run_dir"] = str(run_dir())
    open(sys.argv[1], "w").write(json.dumps(seen))
    """
)


def test_the_tiny_launch_hands_its_run_folder_over_whatever_the_shell_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trainer, seen = tmp_path / "trainer.py", tmp_path / "seen.json"
    trainer.write_text(TRAINER)
    monkeypatch.setenv(job.SCRIPT_PROFILE_ENV, "a3_256die_random_init")  # as train_*_random_init.sh --tiny runs it
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "mine" / "tb"))  # the user's own TensorBoard folder
    monkeypatch.setenv(job.RUN_DIR_ENV, str(tmp_path / "an-earlier-run"))  # left in the shell
    monkeypatch.setattr(job, "trainer_command", lambda _name, _overrides: [sys.executable, str(trainer), str(seen)])
    assert job.main(["--tiny", "--log-dir", str(tmp_path / "logs")]) == 0
    (run_folder,) = (tmp_path / "logs").glob("tiny-*")
    got = json.loads(seen.read_text())
    assert got == {
        job.RUN_DIR_ENV: str(run_folder),
        "TENSORBOARD_DIR": str(tmp_path / "mine" / "tb"),  # the user's wins for TensorBoard itself
        "run_dir": str(run_folder),
    }


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"VERL_PATCHES_RUN_DIR": "/runs/a", "TENSORBOARD_DIR": "/elsewhere/tb"}, Path("/runs/a")),
        ({"TENSORBOARD_DIR": "/runs/b/tensorboard"}, Path("/runs/b")),  # a trainer started by hand
        ({}, None),
    ],
)
def test_the_trainers_run_folder_is_the_launchers_first(environ, expected) -> None:
    assert rank_memory.run_dir(environ) == expected
