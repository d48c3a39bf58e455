"""The token sequences every engine scores: seeded random ids, a short prompt and a response.

verl's workers return log-probs of the response tokens only, so every engine (and the reference) is compared
there: position ``prompt_len + j`` of each sequence, predicted from the tokens before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceShape:
    batch: int
    prompt: int
    response: int

    @property
    def total(self) -> int:
        return self.prompt + self.response


def sequence_shape(tokens: int, dp: int, batch: int = 2) -> SequenceShape:
    """``tokens`` per sequence (a quarter of them, at least one, as prompt); the batch a multiple of ``dp``."""
    if tokens < 2:
        raise ValueError(f"--tokens {tokens}: need at least 2 (one prompt token and one scored token)")
    if dp < 1 or batch < 1:
        raise ValueError(f"batch {batch} and data-parallel size {dp} must be positive")
    prompt = max(1, tokens // 4)
    return SequenceShape(batch=-(-batch // dp) * dp, prompt=prompt, response=tokens - prompt)


def make_sequences(shape: SequenceShape, vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """verl's batch keys for ``shape``: no padding (every position is a real token), ids in [0, vocab)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (shape.batch, shape.total), generator=g)
    mask = torch.ones_like(ids)
    pos = torch.arange(shape.total).expand(shape.batch, -1).contiguous()
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, shape.prompt :].clone()}


def dp_share(batch: dict[str, torch.Tensor], dp: int, dp_rank: int) -> dict[str, torch.Tensor]:
    """The rows data-parallel rank ``dp_rank`` of ``dp`` is given (verl's MEGATRON_COMPUTE_PROTO split)."""
    n = next(iter(batch.values())).shape[0]
    if n % dp:
        raise ValueError(f"batch of {n} sequences is not divisible by the data-parallel size {dp}")
    k = n // dp
    return {key: v[dp_rank * k : (dp_rank + 1) * k] for key, v in batch.items()}


def response_log_probs(logits: torch.Tensor, responses: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(response token | prefix) from full-sequence logits [B, S, V] (fp32 log-softmax)."""
    r = responses.shape[1]
    lg = logits[:, -r - 1 : -1].float() / temperature
    return torch.log_softmax(lg, -1).gather(-1, responses[..., None])[..., 0]
