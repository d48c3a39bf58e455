"""F4 (KV-NZ) is refused together with chunked prefill, by one function (config_checks.kv_nz_problems) that the
preflight and the job both run: in a step that mixes prefill chunks with decodes, F4 drops the decode tokens'
only KV-cache write and npu_paged_cache_load reads ND only. Checked over every combination of the switches
against the rule vLLM 0.9.1 / vllm-ascend 0.9.1 apply, and on the A3 profiles through the preflight and the
job's config check."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_patches.driver.config_checks import OverlayConfigError, check_config, kv_nz_problems, raise_on_problems
from verl_patches.driver.rollout_settings import GRAPH, SCHEDULER, R, chunked_prefill_reason
from verl_patches.launch.preflight.findings import FAIL, HostFacts
from verl_patches.launch.preflight.layout import semantic_findings
from verl_patches.launch.preflight.report import compose, exit_status, run_preflight
from verl_patches.launch.settings import load_settings
from verl_patches.trainer.profiles import PROFILES
from verl_patches.worker_calls.env_names import KV_NZ_FLAG

ROOT = Path(__file__).resolve().parents[2]
LENGTH = 4096  # max_prompt_length 1024 + max_response_length 3072


def config(graph: bool, nz: bool, chunked: bool, batched: int | None, scheduler: bool, scheduler_chunked: bool):
    return OmegaConf.create(
        {
            "data": {"max_prompt_length": 1024, "max_response_length": 3072},
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "enable_chunked_prefill": chunked,
                    "max_num_batched_tokens": batched,
                    "engine_kwargs": {
                        "vllm": {
                            "additional_config": {
                                "torchair_graph_config": {"enabled": graph, "enable_kv_nz": nz},
                                "ascend_scheduler_config": {
                                    "enabled": scheduler,
                                    "enable_chunked_prefill": scheduler_chunked,
                                },
                            }
                        }
                    },
                }
            },
        }
    )


CASES = list(
    itertools.product([True, False], [True, False], [True, False], [None, 1024, 4096], [True, False], [True, False])
)


@pytest.mark.parametrize("graph, nz, chunked, batched, scheduler, scheduler_chunked", CASES)
def test_f4_is_refused_exactly_where_a_step_can_mix_prefill_chunks_with_decodes(
    graph, nz, chunked, batched, scheduler, scheduler_chunked
):
    cfg = config(graph, nz, chunked, batched, scheduler, scheduler_chunked)
    # vLLM V1 chunks whatever enable_chunked_prefill says; only the Ascend scheduler without chunking keeps
    # prefills apart from decodes, and a budget below max_model_len needs chunking
    mixes = chunked or (batched is not None and batched < LENGTH) or not scheduler or scheduler_chunked
    assert (chunked_prefill_reason(cfg) is not None) is mixes
    problems = kv_nz_problems(cfg)
    assert bool(problems) is (graph and nz and mixes)
    if problems:
        (line,) = problems
        assert "\n" not in line and line.startswith(f"{GRAPH}.enable_kv_nz=True (F4, exported as {KV_NZ_FLAG}=1)")
        assert f"with chunked prefill on ({chunked_prefill_reason(cfg)})" in line
        assert line in check_config(cfg)


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ([], f"{R}.enable_chunked_prefill=True"),
        ([f"{R}.enable_chunked_prefill=False"], f"{R}.max_num_batched_tokens=1024 < max_model_len 4096"),
        (
            [f"{R}.enable_chunked_prefill=False", f"{R}.max_num_batched_tokens=4096"],
            f"{SCHEDULER}.enabled=False: vLLM V1's own scheduler chunks prompts",
        ),
    ],
)
def test_the_reason_names_the_key_that_turns_chunked_prefill_on(overrides, reason):
    cfg = compose("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight", *overrides], _settings(), ROOT)
    assert chunked_prefill_reason(cfg).startswith(reason)


def _settings():
    return load_settings({}, None, environ={})


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch):
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CKPT_DIR", "/shared/ckpt/dsv3")


@pytest.mark.parametrize("profile", ["a3_256die_true_weight", "a3_256die_random_init", "a3_16die_smoke"])
def test_the_preflight_and_the_job_refuse_f4_on_every_a3_profile_with_one_line(profile):
    p = PROFILES[profile]
    cfg = compose(p.config_name, [*p.overrides], _settings(), ROOT)
    assert kv_nz_problems(cfg) == []  # as shipped: enable_kv_nz False
    on = compose(p.config_name, [*p.overrides, f"{GRAPH}.enable_kv_nz=True"], _settings(), ROOT)
    (line,) = kv_nz_problems(on)
    # the preflight (dry run) reports it through check_config ...
    (finding,) = [f for f in semantic_findings(on) if f.status == FAIL]
    assert finding.message == line and f"{GRAPH}.enable_kv_nz" in finding.key
    assert f"{R}.enable_chunked_prefill" in finding.key
    # ... and the job's start refuses the same line (main_ppo_npu and the fit loop call raise_on_problems)
    with pytest.raises(OverlayConfigError) as err:
        raise_on_problems(on)
    assert line in str(err.value)


def test_the_whole_preflight_fails_with_f4_and_chunked_prefill():
    on = compose(
        "ppo_mindspeed_trainer", ["profile=a3_256die_true_weight", f"{GRAPH}.enable_kv_nz=True"], _settings(), ROOT
    )
    found = run_preflight(on, _settings(), ROOT, HostFacts(device="cpu"))
    assert exit_status(found) != 0
    assert any(f.status == FAIL and f.message == kv_nz_problems(on)[0] for f in found)


def test_f4_without_chunked_prefill_is_accepted_on_an_a3_profile():
    on = compose(
        "ppo_mindspeed_trainer",
        [
            "profile=a3_256die_true_weight",
            f"{GRAPH}.enable_kv_nz=True",
            f"{R}.enable_chunked_prefill=False",
            f"{R}.max_num_batched_tokens=4096",
            f"{SCHEDULER}.enabled=True",
        ],
        _settings(),
        ROOT,
    )
    assert chunked_prefill_reason(on) is None and kv_nz_problems(on) == [] and check_config(on) == []
