"""The converter's output loads in verl v0.4.0's own `RLHFDataset` and yields the templated prompts."""

from __future__ import annotations

import json

import datasets
import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

from verl_patches.data.convert import convert
from verl_patches.data.templates import TEMPLATES

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PROBLEMS = [{"problem": f"What is {i} plus {i + 1} ?", "answer": str(2 * i + 1), "solution": "add"} for i in range(20)]


def build_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained here on the prompts, with a chat template; nothing downloaded."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<pad>", "<unk>", "<eos>", "<|user|>", "<|assistant|>"]
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=special))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture
def converted(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    source = tmp_path / "deepscaler.json"
    source.write_text(json.dumps(PROBLEMS))
    return convert(source, tmp_path / "out", train_ratio=0.8, seed=11)


@pytest.mark.timeout(120)
def test_rlhf_dataset_reads_the_converted_files(converted, tmp_path):
    corpus = [TEMPLATES["r1_zero"].replace("{problem}", p["problem"]) for p in PROBLEMS]
    tokenizer = build_tokenizer(corpus)
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 96,
            "truncation": "error",
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "return_raw_chat": True,
            "return_full_prompt": True,
            "cache_dir": str(tmp_path / "verl-cache"),
        }
    )
    train = RLHFDataset(data_files=str(converted.train_path), tokenizer=tokenizer, config=config)
    test = RLHFDataset(data_files=str(converted.test_path), tokenizer=tokenizer, config=config)
    assert (len(train), len(test)) == (16, 4)

    seen = set()
    for dataset in (train, test):
        for k in range(len(dataset)):
            item = dataset[k]
            problem = item["extra_info"]["problem"]
            seen.add(problem)
            expected = "<|user|> " + TEMPLATES["r1_zero"].replace("{problem}", problem) + " <|assistant|>"
            assert item["full_prompts"] == expected
            assert item["raw_prompt"] == [
                {"role": "user", "content": TEMPLATES["r1_zero"].replace("{problem}", problem)}
            ]
            assert item["data_source"] == "deepscaler"
            assert item["reward_model"] == {
                "ground_truth": PROBLEMS[item["extra_info"]["source_row"] - 1]["answer"],
                "style": "rule",
            }
            assert item["index"] == item["extra_info"]["index"]
            # Left-padded to max_prompt_length; the real tokens decode back to the templated prompt.
            ids = item["input_ids"][item["attention_mask"].bool()]
            assert item["input_ids"].shape == (96,)
            assert "<unk>" not in tokenizer.decode(ids)
            assert ids.tolist() == tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True)
    assert seen == {p["problem"] for p in PROBLEMS}

    batch = collate_fn([train[0], train[1]])
    assert batch["input_ids"].shape == (2, 96) and batch["input_ids"].dtype == torch.long
    assert list(batch["data_source"]) == ["deepscaler", "deepscaler"]
