"""F3: vLLM's own get_kv_cache_config/unify_kv_cache_configs with a fake executor. The patched
_initialize_kv_caches returns what upstream returns, keeps the configs, and a re-init after a free
reuses them without profiling even when the free memory has changed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl_patches.patches.vllm.v1.engine.declarations import PATCHES
from verl_patches.patching.declaration import Kind
from verl_patches.patching.fingerprint import fingerprint_target as fingerprint
from verl_patches.rollout import kv_cache_config as f3

GiB = 1 << 30


class FakeExecutor:
    """Two workers with MLA layers; records every call the engine core makes."""

    def __init__(self, free: list[int]) -> None:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        spec = FullAttentionSpec(block_size=128, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, use_mla=True)
        self.specs = [{f"model.layers.{i}.self_attn.attn": spec for i in range(4)} for _ in free]
        self.free = free
        self.calls: list[tuple[str, object]] = []

    def get_kv_cache_specs(self):
        self.calls.append(("specs", None))
        return self.specs

    def determine_available_memory(self):
        self.calls.append(("profile", list(self.free)))
        return list(self.free)

    def initialize_from_config(self, configs):
        self.calls.append(("init", configs))


def vllm_config():
    return SimpleNamespace(
        cache_config=SimpleNamespace(num_gpu_blocks_override=None, block_size=128),
        model_config=SimpleNamespace(max_model_len=4096),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
    )


def _upstream(owner: type, name: str):
    """The upstream function even where this test process runs with the overlay (the F3 patch replaced it)."""
    from verl_patches.patching.registry import get_registry

    target = f"{owner.__module__}:{owner.__qualname__}.{name}"
    registry = get_registry()
    for rec in registry.records if registry else []:
        if rec.patch.target == target and rec.status.startswith("applied"):
            return rec.original
    return getattr(owner, name)


def test_first_init_matches_upstream_and_keeps_the_configs() -> None:
    from vllm.v1.engine.core import EngineCore

    ours, theirs = (
        SimpleNamespace(model_executor=FakeExecutor([2 * GiB, 3 * GiB])),
        SimpleNamespace(model_executor=FakeExecutor([2 * GiB, 3 * GiB])),
    )
    got = f3.initialize_kv_caches_keeping_configs(ours, vllm_config())
    want = _upstream(EngineCore, "_initialize_kv_caches")(theirs, vllm_config())  # upstream at the pin
    assert got[0] == want[0] > 0 and got[1] == want[1] == 0 and got[2] == want[2]
    assert (
        [c for c, _ in ours.model_executor.calls]
        == [c for c, _ in theirs.model_executor.calls]
        == ["specs", "profile", "init"]
    )
    assert ours.kv_cache_configs == ours.model_executor.calls[-1][1]
    assert len({c.num_blocks for c in ours.kv_cache_configs}) == 1  # unified to the smaller worker
    assert not hasattr(theirs, "kv_cache_configs")


def test_reinit_reuses_the_saved_configs_without_profiling() -> None:
    core = SimpleNamespace(model_executor=FakeExecutor([2 * GiB, 2 * GiB]))
    blocks, _, _ = f3.initialize_kv_caches_keeping_configs(core, vllm_config())
    saved = core.kv_cache_configs
    core.model_executor.free = [GiB, GiB]  # memory changed in between: a re-profile would differ
    core.model_executor.calls.clear()
    for _ in range(3):
        assert f3.reinitialize_kv_caches(core) == blocks
    assert core.model_executor.calls == [("init", saved)] * 3
    assert core.kv_cache_configs is saved


def test_reinit_without_saved_configs_says_the_patch_was_not_active() -> None:
    with pytest.raises(f3.KVCacheConfigError, match="F3 patch"):
        f3.reinitialize_kv_caches(SimpleNamespace(model_executor=FakeExecutor([GiB])))


def test_mismatched_worker_reports_are_one_clear_error() -> None:
    ex = FakeExecutor([GiB, GiB])
    ex.free = [GiB]
    with pytest.raises(f3.KVCacheConfigError, match="2 workers .* 1 reported"):
        f3.initialize_kv_caches_keeping_configs(SimpleNamespace(model_executor=ex), vllm_config())


def test_declaration_targets_the_pinned_upstream_method() -> None:
    (p,) = PATCHES
    assert p.kind is Kind.REPLACE and p.vendor_item == "F3"
    assert fingerprint(p.target) == p.fingerprint
    assert p.replacement() is f3.initialize_kv_caches_keeping_configs


def test_registry_applies_it_on_the_real_engine_core() -> None:
    from vllm.v1.engine import core

    from verl_patches.patching.registry import Registry

    original = core.EngineCore._initialize_kv_caches
    reg = Registry(list(PATCHES), "cpu").activate()
    try:
        assert reg.records[0].status == "applied", reg.records[0].detail
        assert core.EngineCore._initialize_kv_caches is f3.initialize_kv_caches_keeping_configs
    finally:
        reg.revert()
    assert core.EngineCore._initialize_kv_caches is original
