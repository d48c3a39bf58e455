"""The Megatron worker selects its device before its process group (bring_up): on an actor that sees several
NPUs, each rank takes its own (LOCAL_RANK, else verl's RAY_LOCAL_RANK), not device 0. Checked with two ranks
on the torch_npu CPU emulation, which counts ASCEND_RT_VISIBLE_DEVICES as torch_npu does and whose HCCL
backend refuses a process that sees several devices and chose none (what the old order did)."""

from __future__ import annotations

import pytest

from verl_patches.device import local_device_index
from verl_patches.multirank import run_ranks


def _device_probe(rank: int, world: int, mode: str) -> dict:
    """One rank (mode: ours | upstream_order): the Megatron worker's process group on the torch_npu CPU emulation
    with the visible devices and ranks the test set in its environment; the device every rank selected, or the
    error."""
    from verl_patches.npu_emulation import install_on_cpu_host

    install_on_cpu_host()
    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401  (the emulation: torch.npu, the hccl backend)

    from verl_patches.patches.verl.workers.megatron_workers import init_process_group

    try:
        if mode == "ours":
            init_process_group("npu")
        else:  # what bring_up did before: the group without choosing a device
            dist.init_process_group(backend="hccl")
        devices = [None] * dist.get_world_size()
        dist.all_gather_object(devices, torch.npu.current_device())
        return {"devices": devices, "backend": dist.get_backend()}
    except RuntimeError as e:
        return {"error": str(e)}


def probe_ranks(mode: str, visible: str | None, per_rank: dict[str, list[str]]) -> list[dict]:
    """Two ranks that make their own group (the code under test), with only the device variables given here."""
    unset = dict.fromkeys(("ASCEND_RT_VISIBLE_DEVICES", "LOCAL_RANK", "RAY_LOCAL_RANK", "VERL_PATCHES_DEVICE"))
    env = [
        {
            **unset,
            "ASCEND_RT_VISIBLE_DEVICES": visible,
            "VERL_PATCHES_QUIET": "1",
            **{k: v[r] for k, v in per_rank.items()},
        }
        for r in range(2)
    ]
    return run_ranks(_device_probe, 2, 180, backend=None, rank_env=env, kwargs={"mode": mode})


@pytest.mark.slow
def test_each_rank_takes_its_local_rank_among_several_visible_devices() -> None:
    outs = probe_ranks("ours", "4,5,6,7", {"LOCAL_RANK": ["2", "3"]})
    assert outs[0] == outs[1] == {"devices": [2, 3], "backend": "hccl"}


@pytest.mark.slow
def test_ray_local_rank_when_local_rank_is_unset() -> None:
    outs = probe_ranks("ours", "0,1,2,3", {"RAY_LOCAL_RANK": ["0", "1"]})
    assert outs[0]["devices"] == [0, 1]


@pytest.mark.slow
def test_one_visible_device_is_device_0_whatever_the_local_rank() -> None:
    outs = probe_ranks("ours", "5", {"RAY_LOCAL_RANK": ["3", "4"]})  # Ray gave each actor one NPU
    assert outs[0]["devices"] == [0, 0]


@pytest.mark.slow
def test_the_old_order_is_refused_with_several_visible_devices() -> None:
    outs = probe_ranks("upstream_order", "0,1,2,3", {"LOCAL_RANK": ["0", "1"]})
    assert all("never called torch.npu.set_device" in o["error"] for o in outs)


@pytest.mark.slow
def test_several_devices_and_no_rank_is_one_line() -> None:
    outs = probe_ranks("ours", "0,1", {})
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
