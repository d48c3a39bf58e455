"""The R1-Zero format rule (issue 17): by default, as DeepScaleR's own reward and the R1-Zero recipe
grade, a response without `</think>` scores 0 and so does one without a `\\boxed{}` after the last
`</think>`. `format_rule: relaxed` (a reward kwarg in the trainer config) grades other templates; the
A3 profiles and the tiny local profile (its model answers `<think> a + b = N </think> \\boxed{N}`, the R1-Zero
format) are strict; the FSDP option of the tiny run, whose model answers `\\boxed{N}` alone, is relaxed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl_patches.reward.deepscaler import GradeReason, grade, grade_batch
from verl_patches.trainer.config_compose import compose_config, resolved

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "verl_patches" / "reward" / "entry.py"
KEY = "custom_reward_function.reward_kwargs.format_rule"

_FRAGMENTS = st.sampled_from(["<think>", "\\boxed{7}", "\\fbox{7}", "the answer is 7", "7", " ", "\n", "}", "{", "$"])
text_without_close = (
    st.lists(st.one_of(st.text(max_size=12), _FRAGMENTS), max_size=10)
    .map("".join)
    .filter(lambda s: "</think>" not in s)
)


@pytest.fixture(autouse=True)
def _restore_custom_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "custom_module", None)


@settings(max_examples=200, deadline=None, database=None)
@given(response=text_without_close)
def test_strict_no_think_close_scores_zero_whatever_else_is_there(response):
    result = grade(response, "7")
    assert result.score == 0.0
    assert result.reason in (GradeReason.NO_THINK_CLOSE, GradeReason.UNCLOSED_THINK)


@settings(max_examples=200, deadline=None, database=None)
@given(
    reasoning=text_without_close.filter(lambda s: "<think>" not in s),
    tail=st.sampled_from(
        ["The answer is 7.", "Final answer: 7", "7", "**Answer:** $7$", "so x = 7", "\\[7\\]", "\\boxed{}", "\\boxed{7"]
    ),
)
def test_strict_no_box_after_the_last_think_close_scores_zero(reasoning, tail):
    response = f"<think>{reasoning} \\boxed{{7}}</think> {tail}"
    assert grade(response, "7").score == 0.0


@pytest.mark.parametrize(
    "response, strict, relaxed",
    [
        ("<think>3+4</think> \\boxed{7}", 1.0, 1.0),
        ("3+4</think> \\boxed{7}", 1.0, 1.0),
        ("<think>3+4</think> \\fbox{7}", 1.0, 1.0),
        ("<think>3+4</think> The answer is 7.", 0.0, 1.0),
        ("The answer is 7.", 0.0, 1.0),
        ("\\boxed{7}", 0.0, 1.0),
        ("So \\boxed{7}.", 0.0, 1.0),
        ("<think>3+4 = \\boxed{7}", 0.0, 0.0),
        ("<think>\\boxed{7}</think> so 7", 0.0, 0.0),
        ("<think>a</think> \\boxed{7} <think>again", 0.0, 0.0),
        ("<think>a</think> \\boxed{8}", 0.0, 0.0),
    ],
)
def test_strict_and_relaxed(response, strict, relaxed):
    assert grade(response, "7").score == strict
    assert grade(response, "7", format_rule="strict").score == strict
    assert grade(response, "7", format_rule="relaxed").score == relaxed
    assert [g.score for g in grade_batch([response], ["7"], format_rule="relaxed")] == [relaxed]


@pytest.mark.parametrize("bad", ["STRICT", "r1_zero", "lenient", ""])
def test_unknown_rule_is_one_clear_error(bad):
    with pytest.raises(ValueError, match=rf"{KEY.replace('.', '[.]')}='{bad}': must be one of strict, relaxed"):
        grade("<think>a</think> \\boxed{7}", "7", format_rule=bad)
    with pytest.raises(ValueError, match="format_rule"):
        grade_batch(["<think>a</think> \\boxed{7}"], ["7"], format_rule=bad)


def _reward_fn(name: str = "compute_score", **reward_kwargs):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create(
        {"custom_reward_function": {"path": str(ENTRY), "name": name, "reward_kwargs": reward_kwargs}}
    )
    return get_custom_reward_fn(config)


def test_the_rule_reaches_the_reward_through_verls_loader():
    unboxed = "3 + 4 = 7, the answer is 7"
    assert _reward_fn()("deepscaler", unboxed, "7") == 0.0
    assert _reward_fn(format_rule="strict")("deepscaler", unboxed, "7") == 0.0
    assert _reward_fn(format_rule="relaxed")("deepscaler", unboxed, "7") == 1.0
    batch = _reward_fn("compute_score_batch", format_rule="relaxed")
    assert batch(
        data_sources=["deepscaler"] * 2,
        solution_strs=[unboxed, "\\boxed{7}"],
        ground_truths=["7", "7"],
        extra_infos=[None, None],
    ) == [1.0, 1.0]
    with pytest.raises(ValueError, match=KEY.replace(".", "[.]")):
        _reward_fn(format_rule="loose")("deepscaler", unboxed, "7")


def test_the_rule_is_not_passed_to_verls_own_scorers():
    # gsm8k goes to verl's default_compute_score, which has no format_rule parameter.
    assert _reward_fn(format_rule="strict")("openai/gsm8k", "so 42\n#### 42", "42") == 1.0


@pytest.mark.parametrize(
    "config_name, overrides, rule",
    [
        ("ppo_mindspeed_trainer", [], "strict"),
        ("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight"], "strict"),
        ("ppo_mindspeed_trainer", ["profile=a3_256die_random_init"], "strict"),
        ("ppo_tiny_local", [], "strict"),
        ("ppo_tiny_local_fsdp", [], "relaxed"),
    ],
)
def test_profiles_set_the_rule(monkeypatch, config_name, overrides, rule):
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH"):
        monkeypatch.delenv(name, raising=False)
    cfg = resolved(compose_config(config_name, overrides))
    assert OmegaConf.select(cfg, KEY) == rule
    override = resolved(compose_config(config_name, overrides + [f"{KEY}=relaxed"]))
    assert OmegaConf.select(override, KEY) == "relaxed"


def test_tiny_model_answers_score_under_the_tiny_rule_only():
    """The tiny A3-path model answers in the R1-Zero format, which its strict rule grades; the FSDP option's model
    emits `\\boxed{N}` and EOS with no think tags: its relaxed rule grades it, strict cannot."""
    cfg = resolved(compose_config("ppo_tiny_local", []))
    tiny = _reward_fn(**OmegaConf.to_container(cfg.custom_reward_function.reward_kwargs))
    assert tiny("deepscaler", "<think> 3 + 4 = 7 </think> \\boxed{7}", "7") == 1.0
    assert tiny("deepscaler", "<think> 3 + 4 = 6 </think> \\boxed{6}", "7") == 0.0
    assert tiny("deepscaler", "\\boxed{7}", "7") == 0.0  # no think block: strict
    cfg = resolved(compose_config("ppo_tiny_local_fsdp", []))
    fsdp = _reward_fn(**OmegaConf.to_container(cfg.custom_reward_function.reward_kwargs))
    assert fsdp("deepscaler", "\\boxed{7}", "7") == 1.0
    assert fsdp("deepscaler", "\\boxed{6}", "7") == 0.0
