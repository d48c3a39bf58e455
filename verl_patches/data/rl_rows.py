"""verl v0.4.0 RL rows: what `RLHFDataset` and the reward managers read."""

from __future__ import annotations

import pyarrow as pa

from verl_patches.data.templates import render_prompt
from verl_patches.data.validation import DeepscalerExample

DATA_SOURCE = "deepscaler"
ABILITY = "math"

# Explicit, so every file has the same types whatever the rows hold (e.g. an all-empty solution column).
VERL_RL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("split", pa.string()),
                    ("problem", pa.string()),
                    ("solution", pa.string()),
                    ("source_row", pa.int64()),
                ]
            ),
        ),
    ]
)


def verl_row(example: DeepscalerExample, split: str, index: int, template: str) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": render_prompt(template, example.problem)}],
        "ability": ABILITY,
        "reward_model": {"ground_truth": example.answer, "style": "rule"},
        "extra_info": {
            "index": index,
            "split": split,
            "problem": example.problem,
            "solution": example.solution,
            "source_row": example.row,
        },
    }
