"""F1: our vLLMRollout.__init__ is upstream's without exactly the two checks the A3 rollout settings trip.
Both variants run on the same inputs in one fresh interpreter: with the resolved a3_256die_true_weight
rollout config (rollout TP scaled to the one rank here) upstream stops at its enforce_eager/free_cache_engine
assert and, past that, at its chunked-prefill check, ours builds the engine with the profile's values; every
other check of upstream's __init__ fires identically in both, at upstream's own line."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from probe_runner import run_probe
from verl_patches.patches.verl.workers.rollout.init_checks import DROPPED, CheckNotFoundError, without_checks
from verl_patches.trainer.config_compose import compose_config, resolved

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO / "verl" / "workers" / "rollout" / "vllm_rollout" / "vllm_rollout_spmd.py"


def a3_rollout() -> dict:
    env = {k: os.environ.pop(k) for k in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH") if k in os.environ}
    try:
        cfg = resolved(compose_config("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight"]))
    finally:
        os.environ.update(env)
    return OmegaConf.to_container(cfg.actor_rollout_ref.rollout)


# the other checks' cases pass upstream's two (eager, no chunked prefill), so upstream reaches them too
PAST_BOTH = {"tensor_model_parallel_size": 1, "enforce_eager": True, "enable_chunked_prefill": False}
CASES = {
    "a3": {"rollout": {"tensor_model_parallel_size": 1}},
    "a3_eager": {"rollout": {"tensor_model_parallel_size": 1, "enforce_eager": True}},
    "tp_above_world": {"rollout": {**PAST_BOTH, "tensor_model_parallel_size": 2}},
    "context_too_short": {"rollout": PAST_BOTH, "hf": {"max_position_embeddings": 2048, "rope_scaling": None}},
    "no_max_position": {"rollout": PAST_BOTH, "hf": {"rope_scaling": None}},
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    spec = tmp_path_factory.mktemp("init-checks") / "spec.json"
    spec.write_text(json.dumps({"rollout": a3_rollout(), "cases": CASES}))
    return run_probe("init_checks_probe.py", spec)


@pytest.mark.slow
def test_upstream_refuses_the_a3_rollout_settings_and_ours_builds_the_engine_with_them(probe) -> None:
    a3 = probe["cases"]["a3"]
    assert a3["upstream"]["error"] == "AssertionError" and "free cache engine" in a3["upstream"]["message"]
    eager = probe["cases"]["a3_eager"]  # past the assert, upstream's second check
    assert eager["upstream"]["error"] == "ValueError" and "chunked prefill" in eager["upstream"]["message"]
    assert a3["patched"]["ok"] and eager["patched"]["ok"]
    llm = a3["patched"]["llm"]
    assert (llm["enforce_eager"], llm["enable_chunked_prefill"]) == (False, True)
    assert (llm["max_num_batched_tokens"], llm["max_model_len"]) == (1024, 4096)
    assert llm["max_num_seqs"] == 64  # engine_kwargs.vllm: train_batch_size 512 x n 16 / rollout DP 128
    graph = llm["additional_config"]["torchair_graph_config"]
    assert graph["enabled"] is True and graph["graph_batch_sizes"] == [64]
    assert llm["additional_config"]["ascend_scheduler_config"] == {"enabled": False, "enable_chunked_prefill": True}
    assert a3["patched"]["sampling"] == {"temperature": 0.9, "top_k": 50, "top_p": 0.9, "n": 16}
    assert probe["dropped_checks"] == [d.name for d in DROPPED]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, error, text",
    [
        ("tp_above_world", "AssertionError", "tensor parallel size"),
        ("context_too_short", "AssertionError", "model context length"),
        ("no_max_position", "ValueError", "max_position_embeddings not found"),
    ],
)
def test_every_other_check_fires_as_upstream_at_upstreams_line(probe, case: str, error: str, text: str) -> None:
    up, ours = probe["cases"][case]["upstream"], probe["cases"][case]["patched"]
    assert up["error"] == ours["error"] == error and text in ours["message"]
    assert up["message"] == ours["message"]
    assert (ours["file"], ours["line"]) == (up["file"], up["line"]) and Path(ours["file"]) == UPSTREAM


def _function(src: str):
    namespace: dict = {}
    exec(compile(ast.parse(src), "<t>", "exec"), namespace)  # noqa: S102 (test input)
    return namespace["f"]


def test_a_check_that_is_not_there_exactly_once_is_an_error(tmp_path, monkeypatch) -> None:
    # inspect reads source from a file: write the variants as a module
    mod = tmp_path / "variants_mod.py"
    mod.write_text(
        "def missing(config):\n    return 1\n\n"
        "def twice(config, self=None, max_num_batched_tokens=1, max_model_len=2):\n"
        "    assert not (not config.enforce_eager and config.free_cache_engine)\n"
        "    assert not (not config.enforce_eager and config.free_cache_engine)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import variants_mod

    for fn, found in ((variants_mod.missing, "found 0"), (variants_mod.twice, "found 2")):
        with pytest.raises(CheckNotFoundError) as e:
            without_checks(fn)
        assert found in str(e.value) and "enforce_eager=False with free_cache_engine=True" in str(e.value)
