"""The reward entry as verl v0.4.0 loads it: by path through `get_custom_reward_fn` and inside its
reward managers. deepscaler goes to our reward; every other data source to verl's router unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.reward import get_custom_reward_fn, load_reward_manager
from verl.utils.reward_score import default_compute_score

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "verl_patches" / "reward" / "entry.py"

GOOD = "<think>7 * 6</think> The answer is \\boxed{42}."
WRONG_BUT_CONTAINS_TRUTH = "<think>42 is tempting</think> The answer is \\boxed{41}."
GSM8K_RIGHT = "so the total is 42.\n#### 42"


@pytest.fixture(autouse=True)
def _restore_custom_module(monkeypatch):
    # verl registers the loaded file as sys.modules["custom_module"]; undo that after each test.
    monkeypatch.setitem(sys.modules, "custom_module", None)


def reward_config(name: str = "compute_score", manager: str = "naive", **reward_kwargs):
    return OmegaConf.create(
        {
            "custom_reward_function": {"path": str(ENTRY), "name": name, "reward_kwargs": reward_kwargs},
            "reward_model": {"reward_manager": manager},
            "data": {"reward_fn_key": "data_source"},
        }
    )


def test_verl_loader_routes_deepscaler_to_ours_and_others_to_verl():
    score = get_custom_reward_fn(reward_config(timeout_s=2.0))
    assert score("deepscaler", GOOD, "42") == 1.0
    assert score("deepscaler", WRONG_BUT_CONTAINS_TRUTH, "42") == 0.0
    assert score("deepscaler", "<think>\\boxed{42}", "42") == 0.0
    # Other sources get exactly what verl's own router returns.
    for source, response in [
        ("openai/gsm8k", GSM8K_RIGHT),
        ("openai/gsm8k", "#### 41"),
        ("lighteval/MATH", "\\boxed{42}"),
    ]:
        assert score(source, response, "42") == default_compute_score(source, response, "42")
    with pytest.raises(NotImplementedError):
        score("no-such-source", GOOD, "42")


def test_unknown_reward_kwargs_reach_verl_untouched():
    score = get_custom_reward_fn(reward_config(timeout_s=2.0, sandbox_fusion_url=None))
    assert score("openai/gsm8k", GSM8K_RIGHT, "42") == 1.0
    bad = get_custom_reward_fn(reward_config(no_such_option=1))
    with pytest.raises(TypeError, match="no_such_option"):
        bad("openai/gsm8k", GSM8K_RIGHT, "42")


def test_batch_entry_matches_single_calls():
    batch = get_custom_reward_fn(reward_config(name="compute_score_batch"))
    single = get_custom_reward_fn(reward_config())
    sources = ["deepscaler", "openai/gsm8k", "deepscaler", "deepscaler", "openai/gsm8k"]
    responses = [GOOD, GSM8K_RIGHT, WRONG_BUT_CONTAINS_TRUTH, "<think>x</think> \\boxed{2\\sqrt{3}}", "#### 41"]
    truths = ["42", "42", "42", "\\sqrt{12}", "42"]
    scores = batch(data_sources=sources, solution_strs=responses, ground_truths=truths, extra_infos=[None] * 5)
    assert scores == [single(s, r, t) for s, r, t in zip(sources, responses, truths)] == [1.0, 1.0, 0.0, 1.0, 0.0]


class CharTokenizer:
    """Enough of a tokenizer for verl's reward managers: one token per character, 0 is padding."""

    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids if int(i) != 0)


def make_batch(items: list[tuple[str, str, str]]) -> DataProto:
    prompt_len, response_len = 8, max(len(r) for _, r, _ in items)
    prompts = torch.full((len(items), prompt_len), ord("q"))
    responses = torch.zeros((len(items), response_len), dtype=torch.long)
    mask = torch.zeros((len(items), prompt_len + response_len), dtype=torch.long)
    mask[:, :prompt_len] = 1
    for row, (_, response, _) in enumerate(items):
        responses[row, : len(response)] = torch.tensor([ord(c) for c in response])
        mask[row, prompt_len : prompt_len + len(response)] = 1
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
        non_tensors={
            "data_source": np.array([s for s, _, _ in items], dtype=object),
            "reward_model": np.array([{"ground_truth": t, "style": "rule"} for _, _, t in items], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(items))], dtype=object),
        },
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("manager, name", [("naive", "compute_score"), ("batch", "compute_score_batch")])
def test_verl_reward_managers_score_through_the_entry(manager, name):
    items = [
        ("deepscaler", GOOD, "42"),
        ("deepscaler", WRONG_BUT_CONTAINS_TRUTH, "42"),
        ("openai/gsm8k", GSM8K_RIGHT, "42"),
    ]
    reward_fn = load_reward_manager(reward_config(name=name, manager=manager), CharTokenizer(), num_examine=0)
    rewards = reward_fn(make_batch(items))
    last = [len(r) - 1 for _, r, _ in items]
    assert [rewards[i, last[i]].item() for i in range(len(items))] == [1.0, 0.0, 1.0]
    assert rewards.sum().item() == 2.0


@pytest.mark.timeout(120)
def test_entry_works_from_another_directory_without_pythonpath(tmp_path):
    # A Ray worker may run with a different cwd and no PYTHONPATH; the symbolic path must still work.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('custom_module', {str(ENTRY)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(module.compute_score('deepscaler', '<think>x</think> \\\\boxed{2\\\\sqrt{3}}', '\\\\sqrt{12}'))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "1.0"
