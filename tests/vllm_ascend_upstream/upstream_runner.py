"""Run one batch of vllm-ascend's own tests in a pytest process of its own, and read what happened.

The process starts in the folder that holds upstream's `tests/` package (its rootdir: upstream's tests import
`tests.conftest`), with this folder's `upstream_pytest.ini` only (no setting of this repository's suite applies),
our `upstream_plugin` loaded first, the local model cache for the model names upstream hard-codes, no network for
models, and the settings upstream's own CI runs them with (VLLM_USE_V1=1). The plugin's JSON report is the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SELECTION = HERE / "selection.toml"
INI = HERE / "upstream_pytest.ini"
# the emulated device's capacity: vLLM sizes the KV cache as 0.9 of it and writes it with zeros
DEVICE_GIB = "2"
PER_TEST_TIMEOUT_S = 300


@dataclass(frozen=True)
class BatchRun:
    report: dict
    returncode: int
    output_tail: str


def environment(hub_cache: Path, batch: str, report: Path) -> dict[str, str]:
    env = dict(os.environ)
    path = [str(REPO), str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(path),
            "VLLM_USE_V1": "1",  # as upstream's CI runs tests/singlecard; A3's job runs the V1 engine
            "HF_HUB_CACHE": str(hub_cache),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "VERL_PATCHES_NPU_MEMORY_GIB": DEVICE_GIB,
            "VERL_PATCHES_UPSTREAM_SELECTION": str(SELECTION),
            "VERL_PATCHES_UPSTREAM_BATCH": batch,
            "VERL_PATCHES_UPSTREAM_REPORT": str(report),
        }
    )
    return env


def run_batch(
    rootdir: Path,
    paths: list[str],
    batch: str,
    hub_cache: Path,
    report: Path,
    timeout_s: float,
    collect_only: bool = False,
) -> BatchRun:
    """Run (or only collect) `paths` under `rootdir` for `batch`; the plugin's report and how the process ended."""
    command = [sys.executable, "-m", "pytest", "-c", str(INI), "--rootdir", str(rootdir), "-p", "upstream_plugin"]
    command += ["-p", "no:cacheprovider", "-q", f"--timeout={PER_TEST_TIMEOUT_S}"]
    command += ["--collect-only"] if collect_only else []
    command += ["--", *paths]
    report.unlink(missing_ok=True)
    proc = subprocess.run(
        command,
        cwd=rootdir,
        env=environment(hub_cache, batch, report),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )
    tail = "\n".join(proc.stdout.splitlines()[-60:])
    data = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
    return BatchRun(data, proc.returncode, tail)
