"""The reference: HF transformers' DeepseekV3ForCausalLM loaded from the (truncated) HF folder."""

from __future__ import annotations

from pathlib import Path

import torch

from verl_patches.checks.sequences import response_log_probs


def hf_log_probs(
    hf_dir: str | Path, batch: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32, temperature: float = 1.0
) -> torch.Tensor:
    """Per-token log-probs [B, R] of ``batch['responses']``; the model is freed before returning."""
    # lazy: transformers is heavy and only this path needs it; importing this module stays light
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM.from_pretrained(str(hf_dir), torch_dtype=dtype, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits
        out = response_log_probs(logits, batch["responses"], temperature)
    del model, logits
    return out
