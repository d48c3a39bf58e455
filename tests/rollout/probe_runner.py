"""Runs a probe script of these tests in a fresh interpreter that finds vLLM and vllm-ascend as the job's
processes do: through the generated .dist-info entry points (generated first where a checkout lacks them), with
none of the caller's VLLM_* settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fresh_python import fresh_python
from verl_patches.sources import dist_info

REPO = Path(__file__).resolve().parents[2]
VLLM_PACKAGES = ("vllm", "vllm_ascend")


def vllm_dist_path() -> str:
    """The path entry of the generated vllm and vllm_ascend .dist-info folders."""
    entry = dist_info.path_entry(REPO)
    if not all(Path(entry, f"{name}-0.9.1.dist-info").is_dir() for name in VLLM_PACKAGES):
        from verl_patches.sources.lock import load_lock

        dist_info.generate(REPO, load_lock(REPO / "sources.lock"), list(VLLM_PACKAGES))
    return entry


def run_probe(script: str, arg: str | Path, **env: str) -> dict:
    """The JSON object that `script` (a file beside these tests), run on `arg` with `env` added, prints last."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    environ.update(PYTHONPATH=os.pathsep.join([str(REPO), vllm_dist_path()]), **env)
    p = fresh_python(str(Path(__file__).with_name(script)), str(arg), env=environ, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])
