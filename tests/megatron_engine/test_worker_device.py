"""The Megatron worker selects its device before its process group (bring_up): on an actor that sees several
NPUs, each rank takes its own (LOCAL_RANK, else verl's RAY_LOCAL_RANK), not device 0. Checked with two ranks
on the torch_npu CPU emulation, which counts ASCEND_RT_VISIBLE_DEVICES as torch_npu does and whose HCCL
backend refuses a process that sees several devices and chose none (what the old order did)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from verl_patches.device import local_device_index

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("device_probe.py")


def run_ranks(mode: str, visible: str | None, per_rank: dict[str, list[str]]) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ASCEND_RT_VISIBLE_DEVICES", "LOCAL_RANK", "RAY_LOCAL_RANK", "PYTHONPATH", "VERL_PATCHES_DEVICE")
    }
    base.update(
        PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", VERL_PATCHES_QUIET="1"
    )
    if visible is not None:
        base["ASCEND_RT_VISIBLE_DEVICES"] = visible
    procs = [
        subprocess.Popen(
            [sys.executable, str(PROBE), mode],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**base, "RANK": str(r), **{k: v[r] for k, v in per_rank.items()}},
        )
        for r in range(2)
    ]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=180)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


@pytest.mark.slow
def test_each_rank_takes_its_local_rank_among_several_visible_devices() -> None:
    outs = run_ranks("ours", "4,5,6,7", {"LOCAL_RANK": ["2", "3"]})
    assert outs[0] == outs[1] == {"devices": [2, 3], "backend": "hccl"}


@pytest.mark.slow
def test_ray_local_rank_when_local_rank_is_unset() -> None:
    outs = run_ranks("ours", "0,1,2,3", {"RAY_LOCAL_RANK": ["0", "1"]})
    assert outs[0]["devices"] == [0, 1]


@pytest.mark.slow
def test_one_visible_device_is_device_0_whatever_the_local_rank() -> None:
    outs = run_ranks("ours", "5", {"RAY_LOCAL_RANK": ["3", "4"]})  # Ray gave each actor one NPU
    assert outs[0]["devices"] == [0, 0]


@pytest.mark.slow
def test_the_old_order_is_refused_with_several_visible_devices() -> None:
    outs = run_ranks("upstream_order", "0,1,2,3", {"LOCAL_RANK": ["0", "1"]})
    assert all("never called torch.npu.set_device" in o["error"] for o in outs)


@pytest.mark.slow
def test_several_devices_and_no_rank_is_one_line() -> None:
    outs = run_ranks("ours", "0,1", {})
    assert all("neither LOCAL_RANK nor RAY_LOCAL_RANK" in o["error"] for o in outs)


@pytest.mark.parametrize(
    "visible, env, index",
    [
        (1, {}, 0),
        (1, {"LOCAL_RANK": "7"}, 0),
        (8, {"LOCAL_RANK": "5"}, 5),
        (8, {"RAY_LOCAL_RANK": "6"}, 6),
        (8, {"LOCAL_RANK": "1", "RAY_LOCAL_RANK": "6"}, 1),
        (8, {"LOCAL_RANK": "", "RAY_LOCAL_RANK": "2"}, 2),
    ],
)
def test_local_device_index(visible: int, env: dict, index: int) -> None:
    assert local_device_index(visible, env) == index


@pytest.mark.parametrize(
    "visible, env, text",
    [
        (0, {}, "no accelerator"),
        (4, {"LOCAL_RANK": "4"}, "LOCAL_RANK=4 but this process sees 4"),
        (2, {}, "neither LOCAL_RANK"),
    ],
)
def test_local_device_index_refusals(visible: int, env: dict, text: str) -> None:
    with pytest.raises(RuntimeError, match=text):
        local_device_index(visible, env)
