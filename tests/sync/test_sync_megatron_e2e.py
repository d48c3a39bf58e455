"""End to end on CPU: verl's Megatron actor (MindSpeed-LLM DeepSeek-V3, TP2·PP2·EP2, layers [2, 3], 8 experts,
8 gloo ranks) synced into the CPU rollout stand-in by the E1 sharding manager and the patched
``per_tensor_generator``. The rollout's per-token log-probs equal the actor's within 1e-4 before and after
an ``update_actor`` step, and the update reaches the rollout. Each rank serves one expert (rollout EP8).
The rollout side is the test-only stand-in (transformers' DeepseekV3 behind vLLM's own loader): the claim
here is the sync's, at a layout (TP2·PP2·EP2 into EP8) that 8 ranks of vllm-ascend's engine on 2 cores
could not build in the suite's time; the tiny run syncs into vllm-ascend's engine every step.
"""

from __future__ import annotations

import json

import pytest

from tests.sync.e2e_ranks import build_hf, rank_e2e
from verl_patches.multirank import run_ranks

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.needs_components("mindspeed", "mindspeed_llm"),
]
TOL = 1e-4


def test_megatron_actor_to_rollout_standin(tmp_path):
    from tests.megatron_engine.golden_assets import convert

    hf = build_hf(tmp_path)
    ckpt = convert(hf, tmp_path / "mcore", tp=2, pp=2, ep=2, num_layer_list=(2, 3))
    results = run_ranks(
        rank_e2e, 8, 1100, preload=("verl_patches.prelude_patch",), kwargs={"hf": str(hf), "ckpt": str(ckpt)}
    )
    print(json.dumps(results, indent=1))
    for rank, r in enumerate(results):  # the harness raises on any rank's error
        assert r["per_tensor_generator"].startswith("verl_patches."), r
        assert r["before_diff"] < TOL and r["after_diff"] < TOL, r
        assert r["update_changed_rollout"] > 1e-3, r
        assert r["before_experts"] == [rank], r
        assert r["lifecycle"] == ["onload", "free", "offload"] * 2, r
