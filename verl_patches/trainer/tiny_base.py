"""An option of the tiny assets (`TinySpec.base_steps`, `+overlay.tiny_base_steps=N` on the command line): the
random DeepSeek-V3-shaped model after a short supervised pass over the training split, so that R1-Zero-style
RL starts, as on A3, from a model that already answers some problems.

Why: measured with the A3 profile's GRPO settings (16 samples a prompt, temperature 0.9, top-p 0.9, top-k 50),
the random tiny model collapses within about 16 steps onto the most frequent answer for every prompt. Once
that answer holds more than 0.9 of the probability, top-p sampling returns only it, all 16 samples of a group
agree, every advantage is zero and learning stops, whatever the learning rate (1e-2 to 3e-4 tried), so greedy
validation does not rise. From a 60-step base (held-out accuracy 0.50) at lr 1e-3, three seeded 60-step runs
ended validation at 0.72, 0.56 and 0.74, but one of them barely moved its training reward (window means
0.43-0.51), close to what a frozen policy scores from the same base: a golden baseline over such runs would
no longer tell a learning rate of 0 from a healthy run, so the tiny profile does not enable it yet.

Only the training split is read: the held-out problems stay unseen. The pass is seeded and runs on the CPU;
the answer token and the EOS after it are the targets (the response the reward grades).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

BASE_LR = 3e-3
BASE_BATCH = 64


def supervised_rows(train_parquet: Path, tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """(prompt ids as the rollout sees them, the response ids: `\\boxed{answer}` then EOS) per training row."""
    import pandas as pd

    rows = []
    frame = pd.read_parquet(train_parquet, columns=["prompt", "reward_model"])
    for prompt, reward in zip(frame["prompt"], frame["reward_model"]):
        ids = tokenizer.apply_chat_template([dict(m) for m in prompt], add_generation_prompt=True, tokenize=True)
        answer = tokenizer.convert_tokens_to_ids(f"\\boxed{{{reward['ground_truth']}}}")
        if answer == tokenizer.unk_token_id:
            raise ValueError(f"{train_parquet}: answer {reward['ground_truth']!r} is not one token of the tokenizer")
        rows.append((list(ids), [answer, tokenizer.eos_token_id]))
    return rows


def _batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    """Left-padded prompt + response, its attention mask, and labels on the response tokens only."""
    import torch

    seqs = [p + r for p, r in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100)
    for i, ((p, r), s) in enumerate(zip(rows, seqs)):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
        labels[i, width - len(r):] = torch.tensor(r)
    return ids, mask, labels


def train_base(model_dir: Path, train_parquet: Path, steps: int, seed: int) -> float:
    """`steps` supervised steps of `BASE_BATCH` training rows on the model in `model_dir`, saved in place;
    returns the last loss. The caller's stamp (tiny_assets) marks the folder complete only afterwards."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = supervised_rows(train_parquet, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.train()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optim = torch.optim.AdamW(model.parameters(), lr=BASE_LR)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        ids, mask, labels = _batch([rows[rng.randrange(len(rows))] for _ in range(BASE_BATCH)],
                                   tokenizer.pad_token_id)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    model.eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    return float(loss.detach())
