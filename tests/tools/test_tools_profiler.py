"""C8: the light cache release and PRINT_MEMORY-gated memory lines; C9: NPUProfiler gated by rank and
PROFILE_UPDATE, through a recording factory and through torch.profiler on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from verl_patches import tools
from verl_patches.profiler import NPUProfiler, profiling_requested


class DeviceModule:
    def __init__(self, virt: bool) -> None:
        self.calls: list[str] = []
        if virt:
            self.empty_virt_addr_cache = lambda: self.calls.append("virt")

    def empty_cache(self) -> None:
        self.calls.append("full")


def test_empty_cache_prefers_the_virtual_address_release() -> None:
    with_virt, without = DeviceModule(True), DeviceModule(False)
    assert tools.empty_cache(with_virt) == "empty_virt_addr_cache" and with_virt.calls == ["virt"]
    assert tools.empty_cache(without) == "empty_cache" and without.calls == ["full"]


def test_empty_cache_on_cpu_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools.device, "accelerator_module", lambda: None)
    assert tools.empty_cache() == "none"


@pytest.mark.parametrize(
    "env, rank, only0, logged",
    [
        ({}, 0, True, False),
        ({"PRINT_MEMORY": "0"}, 0, True, False),
        ({"PRINT_MEMORY": "1"}, 0, True, True),
        ({"PRINT_MEMORY": "1"}, 3, True, False),
        ({"PRINT_MEMORY": "1"}, 3, False, True),
    ],
)
def test_print_memory_gating(env: dict, rank: int, only0: bool, logged: bool) -> None:
    line = tools.print_memory("after update", only_rank_0=only0, environ=env, rank=rank)
    assert (line is not None) is logged
    if logged:
        assert f"[rank {rank}]" in line and "after update: used" in line and "GiB" in line


class FakeProf:
    def __init__(self, log: list[str], out: str, **kw: Any) -> None:
        self.log = log
        log.append(f"create {Path(out).name} {kw}")

    def start(self) -> None:
        self.log.append("start")

    def step(self) -> None:
        self.log.append("step")

    def stop(self) -> None:
        self.log.append("stop")


@pytest.mark.parametrize(
    "env, rank, active",
    [
        ({"PROFILE_UPDATE": "1"}, 0, True),
        ({"PROFILE_UPDATE": "1"}, 5, False),
        ({"PROFILE_UPDATE": "0"}, 0, False),
        ({}, 0, False),
    ],
)
def test_profiler_is_gated_by_rank_and_env(tmp_path: Path, env: dict, rank: int, active: bool) -> None:
    log: list[str] = []
    p = NPUProfiler(
        "update_actor",
        ranks=[0, 1],
        rank=rank,
        root=tmp_path,
        environ=env,
        factory=lambda out, **kw: FakeProf(log, out, **kw),
    )
    with p:
        p.step()
    assert p.enabled is active
    assert log == (
        ["create update_actor {'active_steps': 1, 'warmup_steps': 0}", "start", "step", "stop"] if active else []
    )
    assert (tmp_path / "update_actor").is_dir() is active


def test_profiler_stage_is_a_plain_name(tmp_path: Path) -> None:
    for bad in ("", "../x", "a/b", ".."):
        with pytest.raises(ValueError, match="plain folder name"):
            NPUProfiler(bad, rank=0, root=tmp_path, environ={})


def test_torch_profiler_shim_writes_a_trace_on_cpu(tmp_path: Path) -> None:
    import torch

    p = NPUProfiler("update_actor", ranks=[0], rank=0, root=tmp_path, environ={"PROFILE_UPDATE": "1"})
    p.start()
    torch.ones(64, 64) @ torch.ones(64, 64)
    p.step()
    p.stop()
    assert list((tmp_path / "update_actor").glob("*.json")), "no trace written"


def test_profiling_requested_values() -> None:
    assert profiling_requested({"PROFILE_UPDATE": "1"}) and not profiling_requested({"PROFILE_UPDATE": "off"})
