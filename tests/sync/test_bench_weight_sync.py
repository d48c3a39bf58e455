"""The weight-sync benchmark runs in CI: real gloo sync of both paths, ratios printed, PASS required."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.timeout(1000)]


def test_bench_weight_sync_passes_and_prints_the_ratios(tmp_path):
    out = tmp_path / "sync.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_weight_sync.py"),
            "--hidden",
            "128",
            "--experts",
            "16",
            "--moe-ffn",
            "64",
            "--vocab",
            "512",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=950,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PASS" in r.stdout.splitlines()[-1]
    assert "received / lower bound        all-to-all 1.00" in r.stdout
    assert "wall time" in r.stdout and out.is_file()
