"""An option of the tiny assets (`TinySpec.base_steps`, `+overlay.tiny_base_steps=N` on the command line): the
random DeepSeek-V3-shaped model after a short supervised pass over the training split, so that R1-Zero-style
RL starts, as on A3, from a model that already answers some problems.

Why: measured with the A3 profile's GRPO settings (16 samples a prompt, temperature 0.9, top-p 0.9, top-k 50),
the random tiny model collapses within about 16 steps onto the most frequent answer for every prompt. Once
that answer holds more than 0.9 of the probability, top-p sampling returns only it, all 16 samples of a group
agree, every advantage is zero and learning stops, whatever the learning rate (1e-2 to 3e-4 tried), so greedy
validation does not rise.

How strong a base (the tiny profile: 60 steps, then RL at lr 3e-4). Measured 2026-11-28 for the A3-path
model (256 small experts routed as DeepSeek-V3, responses `<think> a + b = N </think> \\boxed{N}` graded by the
strict rule), greedy accuracy on the held-out problems and sampled accuracy (A3's sampling, 8 samples) on 40
training problems after N supervised steps: 60 steps 0.35 / 0.33, 80 steps 0.87 / 0.62 (the worked format is
learnt late: at 40 steps 0.02, then fast). From the 60-step base, README command 1 (lr 3e-4) took the training
reward from 0.29 in steps 1-10 to 0.51 in steps 51-60 and validation from 0.35 to 0.52, 0.56 and 0.87 at steps
20, 40 and 60, with room left to learn in both; an 80-step base leaves validation little room to rise. Measured
earlier for the one-token answers of the relaxed format (a 0.3 M-parameter model, an in-process replica of the
run's GRPO over six seeds): a weaker base stalled in some seeds (its reward is then what a frozen policy scores,
so a golden baseline cannot tell a learning rate of 0 from it), a base that is confidently wrong stops top-p
from sampling the right answer, and lr 3e-3 collapsed the policy in 5 of 6 runs.

Only the training split is read: the held-out problems stay unseen. The pass is seeded and runs on the CPU;
the response tokens (`tiny_assets.response_tokens`: the answer token, after its working in think tags in the
tiny profile) and the EOS after them are the targets (the response the reward grades).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

BASE_LR = 3e-3
BASE_BATCH = 64


ResponseTokens = Callable[[str, str], list[str]]  # (problem text, answer) -> the response's tokens


def boxed_answer(problem: str, answer: str) -> list[str]:
    return [f"\\boxed{{{answer}}}"]


def supervised_rows(
    train_parquet: Path, tokenizer: Any, response: ResponseTokens = boxed_answer
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids as the rollout sees them, the response ids: `response(problem, answer)` then EOS) per
    training row."""
    # lazy: pandas is heavy and only this path needs it; importing this module stays light
    import pandas as pd

    rows = []
    frame = pd.read_parquet(train_parquet, columns=["prompt", "reward_model", "extra_info"])
    for prompt, reward, info in zip(frame["prompt"], frame["reward_model"], frame["extra_info"]):
        ids = tokenizer.apply_chat_template([dict(m) for m in prompt], add_generation_prompt=True, tokenize=True)
        tokens = response(info["problem"], str(reward["ground_truth"]))
        target = tokenizer.convert_tokens_to_ids(tokens)
        missing = [t for t, i in zip(tokens, target) if i == tokenizer.unk_token_id]
        if missing:
            raise ValueError(f"{train_parquet}: response token(s) {missing!r} are not tokens of the tokenizer")
        rows.append((list(ids), [*target, tokenizer.eos_token_id]))
    return rows


def _batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    """Left-padded prompt + response, its attention mask, and labels on the response tokens only."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    seqs = [p + r for p, r in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100)
    for i, ((_prompt, r), s) in enumerate(zip(rows, seqs)):
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
        labels[i, width - len(r) :] = torch.tensor(r)
    return ids, mask, labels


def train_base(
    model_dir: Path, train_parquet: Path, steps: int, seed: int, response: ResponseTokens = boxed_answer
) -> float:
    """`steps` supervised steps of `BASE_BATCH` training rows on the model in `model_dir`, saved in place;
    returns the last loss. The caller's stamp (tiny_assets) marks the folder complete only afterwards."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    # lazy: transformers is heavy and only this path needs it; importing this module stays light
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = supervised_rows(train_parquet, tokenizer, response)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.train()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optim = torch.optim.AdamW(model.parameters(), lr=BASE_LR)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        ids, mask, labels = _batch([rows[rng.randrange(len(rows))] for _ in range(BASE_BATCH)], tokenizer.pad_token_id)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    model.eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    return float(loss.detach())
