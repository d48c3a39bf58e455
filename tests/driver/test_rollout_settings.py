"""The rollout engine's settings (vendor items C1, F1, F6): max_num_seqs = train_batch_size x n / rollout DP
reaches the engine and is the TorchAir graph batch size; contradictions between verl's rollout config, vLLM
and vllm-ascend are refused by the trainer entry and the preflight, each naming the key; what verl's two
dropped __init__ checks protected is checked instead."""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig

from verl_patches.base.job_layout import ROLLOUT_TP_KEY, JobLayoutError, job_layout
from verl_patches.driver.config_checks import check_config
from verl_patches.driver.rollout_settings import (
    ENGINE,
    GRAPH,
    SCHEDULER,
    describe,
    rollout_problems,
    seqs_per_rollout_engine,
)
from verl_patches.launch.preflight.findings import FAIL, OK
from verl_patches.launch.preflight.layout import engine_findings, semantic_findings
from verl_patches.trainer.config_compose import compose_config, resolved

R = "actor_rollout_ref.rollout"


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH"):
        monkeypatch.delenv(name, raising=False)


@cache
def a3(*overrides: str, profile: str = "a3_256die_true_weight") -> DictConfig:
    return resolved(compose_config("ppo_mindspeed_trainer", [f"profile={profile}", *overrides]))


@pytest.mark.parametrize(
    "profile, seqs", [("a3_256die_true_weight", 64), ("a3_256die_random_init", 64), ("a3_16die_smoke", 32)]
)
def test_max_num_seqs_is_the_per_engine_share_and_the_graph_batch_size(profile: str, seqs: int) -> None:
    c = a3(profile=profile)
    assert c.actor_rollout_ref.rollout.max_num_seqs == seqs
    assert c.actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs == seqs
    graph = c.actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config
    assert graph.enabled is True and list(graph.graph_batch_sizes) == [seqs]
    assert rollout_problems(c) == [] and check_config(c) == []


def test_max_num_seqs_follows_an_override_of_its_inputs() -> None:
    c = a3("data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=256", f"{R}.n=8")
    assert c.actor_rollout_ref.rollout.max_num_seqs == 256 * 8 // 128
    assert list(
        c.actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.graph_batch_sizes
    ) == [16]
    assert rollout_problems(c) == []


@settings(max_examples=60, deadline=None)
@given(
    tbs=st.integers(1, 4096),
    n=st.integers(1, 64),
    nnodes=st.integers(1, 32),
    per_node=st.integers(1, 16),
    tp=st.sampled_from([1, 2, 4, 8]),
)
def test_seqs_per_engine_holds_every_engines_sequences(tbs, n, nnodes, per_node, tp) -> None:
    world = nnodes * per_node
    if world % tp:  # the profiles' resolver refuses a rollout TP that splits an engine across the world's end
        with pytest.raises(JobLayoutError, match=rf"^{ROLLOUT_TP_KEY}={tp} does not divide the world of {world}"):
            seqs_per_rollout_engine(tbs, n, nnodes, per_node, tp)
        return
    engines = world // tp
    seqs = seqs_per_rollout_engine(tbs, n, nnodes, per_node, tp)
    assert seqs * engines >= tbs * n > (seqs - 1) * engines
    if (tbs * n) % engines == 0:
        assert seqs == tbs * n // engines


@pytest.mark.parametrize(
    "overrides, key",
    [
        ((f"{R}.enforce_eager=True",), f"{GRAPH}.enabled"),  # vllm-ascend: graph mode and eager mode
        ((f"{GRAPH}.enabled=False",), f"{GRAPH}.enable_multistream_mla"),  # graph-only options with graph off
        ((f"{GRAPH}.graph_batch_sizes=[32]",), f"{GRAPH}.graph_batch_sizes"),
        ((f"{ENGINE}.max_num_seqs=32",), f"{ENGINE}.max_num_seqs"),
        ((f"{R}.enable_chunked_prefill=False",), f"{R}.enable_chunked_prefill"),  # 1024 < 4096
        (
            (f"{SCHEDULER}.enabled=True", f"{SCHEDULER}.enable_chunked_prefill=False"),
            f"{SCHEDULER}.enable_chunked_prefill",
        ),
        ((f"{SCHEDULER}.enabled=True",), f"{SCHEDULER}.enabled"),  # with chunked prefill it never schedules
        ((f"{R}.max_num_batched_tokens=32",), f"{R}.max_num_batched_tokens"),  # below max_num_seqs 64
        ((f"{R}.free_cache_engine=False",), f"{R}.free_cache_engine"),
    ],
)
def test_each_contradiction_is_refused_naming_its_key(overrides: tuple[str, ...], key: str) -> None:
    c = a3(*overrides)
    problems = rollout_problems(c)
    assert problems and any(key in p for p in problems), problems
    assert set(problems) <= set(check_config(c))  # the trainer entry refuses them too
    found = engine_findings(c, job_layout(c).rollout.dp)
    assert [f.status for f in found if f.check == "rollout.engine"] == [FAIL] * len(problems)
    assert all(f.check != "config.semantic" or f.status == OK for f in semantic_findings(c))  # reported once


def test_graph_off_with_eager_and_no_graph_options_is_consistent() -> None:
    c = a3(
        f"{GRAPH}.enabled=False",
        f"{R}.enforce_eager=True",
        f"{GRAPH}.enable_multistream_mla=False",
        f"{GRAPH}.enable_multistream_moe=False",
        f"{GRAPH}.graph_batch_sizes=[]",
    )
    assert rollout_problems(c) == []
    assert describe(c, job_layout(c).rollout.dp).startswith("eager")


def test_eager_false_without_torchair_is_refused() -> None:
    """ACL graph, vllm-ascend's other graph mode, does not run DeepSeek (NotImplementedError at engine start)."""
    c = a3(
        f"{GRAPH}.enabled=False",
        f"{GRAPH}.enable_multistream_mla=False",
        f"{GRAPH}.enable_multistream_moe=False",
        f"{GRAPH}.graph_batch_sizes=[]",
    )
    assert [p for p in rollout_problems(c) if "ACL graph" in p]


def test_preflight_says_the_graph_batch_size() -> None:
    (engine, lifecycle) = engine_findings(a3(), job_layout(a3()).rollout.dp)
    assert engine.status == OK and "TorchAir graph mode on, graph batch size [64]" in engine.message
    assert "max_num_seqs 64 (train_batch_size 512 x n 16 / rollout DP 128 = 64)" in engine.message
    assert "chunked prefill on (max_num_batched_tokens 1024, max_model_len 4096)" in engine.message
    assert lifecycle.status == OK and "rebuilt" in lifecycle.message


ON_1024 = "chunked prefill on (max_num_batched_tokens 1024, max_model_len 4096)"
ON_4096 = "chunked prefill on (max_num_batched_tokens 4096, max_model_len 4096)"


@pytest.mark.parametrize(
    "overrides, said",
    [
        ((), f"{ON_1024} because {R}.enable_chunked_prefill=True"),
        (
            (f"{R}.enable_chunked_prefill=False", f"{R}.max_num_batched_tokens=4096"),
            f"{ON_4096} because {SCHEDULER}.enabled=False: vLLM V1's own scheduler chunks prompts",
        ),
        (
            (f"{R}.enable_chunked_prefill=False", f"{R}.max_num_batched_tokens=4096", f"{SCHEDULER}.enabled=True"),
            "chunked prefill off (max_num_batched_tokens 4096, max_model_len 4096)",
        ),
    ],
)
def test_the_engine_line_says_what_the_engine_does_not_what_one_key_says(overrides, said) -> None:
    """With the Ascend scheduler off vLLM V1 chunks whatever enable_chunked_prefill says: the line follows
    chunked_prefill_reason, and says off only where the Ascend scheduler keeps prefills apart."""
    c = a3(*overrides)
    line = describe(c, job_layout(c).rollout.dp)
    assert said in line
    assert ("chunked prefill off" in line) is (" because " not in line)


@pytest.mark.parametrize(
    "scheduler, why",
    [
        ("False", "(vLLM V1's scheduler chunks prompts then whatever the key says; say so)"),
        ("True", "(vllm-ascend's Ascend scheduler refuses it without chunked prefill)"),
    ],
)
def test_a_budget_below_max_model_len_without_chunking_says_who_chunks_or_refuses(scheduler, why) -> None:
    c = a3(f"{R}.enable_chunked_prefill=False", f"{SCHEDULER}.enabled={scheduler}")
    (line,) = [p for p in rollout_problems(c) if "< max_model_len 4096 needs" in p]
    assert line == f"{R}.max_num_batched_tokens=1024 < max_model_len 4096 needs {R}.enable_chunked_prefill=True {why}"


def test_not_a_vllm_rollout_has_no_engine_rules() -> None:
    c = resolved(compose_config("ppo_tiny_local_fsdp", []))
    assert rollout_problems(c) == []


# ---- the model's length limit, as vLLM derives it ------------------------------------------------------

LENGTH_CONFIGS = {
    "deepseek-v3 (yarn 4096 x 40)": {
        "max_position_embeddings": 163840,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
    },
    "tiny (yarn 64 x 4)": {
        "max_position_embeddings": 256,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    },
    "yarn below max_position_embeddings": {
        "max_position_embeddings": 8192,
        "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024},
    },
    "plain": {"max_position_embeddings": 2048},
    "linear x 2": {"max_position_embeddings": 2048, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "dynamic x 1.5": {"max_position_embeddings": 1000, "rope_scaling": {"type": "dynamic", "factor": 1.5}},
    "llama3 (not scaled)": {
        "max_position_embeddings": 4096,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    },
    "default rope (no factor)": {"max_position_embeddings": 3000, "rope_scaling": {"rope_type": "default"}},
    "seq_length smaller": {"max_position_embeddings": 4096, "seq_length": 1024},
    "model_max_length larger": {"max_position_embeddings": 4096, "model_max_length": 8192},
    "model_max_length smaller": {"max_position_embeddings": 4096, "model_max_length": 2048},
}


@pytest.mark.parametrize("name", sorted(LENGTH_CONFIGS))
def test_the_length_limit_is_the_one_vllm_enforces(name: str) -> None:
    """vLLM 0.9.1's own `_get_and_verify_max_len` on the same config refuses exactly the lengths above ours."""
    from transformers import PretrainedConfig
    from vllm.config import _get_and_verify_max_len

    from verl_patches.driver.rollout_settings import model_length_limit

    model = LENGTH_CONFIGS[name]
    hf = PretrainedConfig(**json.loads(json.dumps(model)))
    if isinstance(getattr(hf, "rope_scaling", None), dict) and "type" in hf.rope_scaling:
        hf.rope_scaling["rope_type"] = hf.rope_scaling["type"]  # what vLLM's patch_rope_scaling does on load
    limit, how = model_length_limit(model)
    assert limit is not None and how
    for asked in (1, limit - 1, limit, limit + 1, 2 * limit):
        try:
            _get_and_verify_max_len(hf, asked, False, None)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted is (asked <= limit), (name, asked, limit, how)
    assert _get_and_verify_max_len(hf, None, False, None) <= limit  # vLLM's default stays inside too


def test_a_config_without_a_length_key_has_no_limit() -> None:
    from verl_patches.driver.rollout_settings import model_length_limit

    assert model_length_limit({"hidden_size": 8})[0] is None


@pytest.mark.parametrize(
    "model, key",
    [
        ({"max_position_embeddings": "4096"}, "max_position_embeddings"),
        ({"max_position_embeddings": True}, "max_position_embeddings"),
        ({"max_position_embeddings": float("nan")}, "max_position_embeddings"),
        ({"max_position_embeddings": 0}, "max_position_embeddings"),
        ({"max_position_embeddings": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4}}, "original_max"),
        ({"max_position_embeddings": 64, "rope_scaling": {"rope_type": "linear", "factor": "x"}}, "factor"),
    ],
)
def test_a_length_vllm_could_not_use_is_named(model: dict, key: str) -> None:
    from verl_patches.driver.rollout_settings import model_length_limit

    with pytest.raises(ValueError, match=key):
        model_length_limit(model)


@pytest.mark.parametrize(
    "blocks, prompt, response, seqs, refused",
    [
        (129, 48, 12, 128, False),
        (128, 48, 12, 128, True),
        (80, 48, 12, 128, True),
        (257, 100, 40, 128, False),
        (256, 100, 40, 128, True),
    ],
)
def test_a_fixed_kv_block_count_must_hold_every_sequence_of_the_engine(
    blocks: int, prompt: int, response: int, seqs: int, refused: bool
) -> None:
    # 128-token blocks (vllm-ascend's): 60 tokens take 1, 140 take 2; a queued sequence is prefilled among the
    # others' decodes, in eager steps, and the graph-decode share falls (measured: 0.82 -> 0.54 in the tiny run)
    c = resolved(
        compose_config(
            "ppo_tiny_local",
            [
                "overlay.tiny_assets_dir=/tmp/none",
                f"actor_rollout_ref.rollout.engine_kwargs.vllm.num_gpu_blocks_override={blocks}",
                f"data.max_prompt_length={prompt}",
                f"data.max_response_length={response}",
                f"actor_rollout_ref.rollout.max_num_seqs={seqs}",
            ],
        )
    )
    problems = [p for p in rollout_problems(c) if "num_gpu_blocks_override" in p]
    assert bool(problems) is refused, problems
    if refused:
        assert f"set it to at least {seqs * -(-(prompt + response) // 128) + 1}" in problems[0]  # + the null block


def test_the_tiny_profiles_kv_cache_holds_its_engines_sequences() -> None:
    c = resolved(compose_config("ppo_tiny_local", ["overlay.tiny_assets_dir=/tmp/none"]))
    assert rollout_problems(c) == []
