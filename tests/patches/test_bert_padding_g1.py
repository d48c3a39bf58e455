"""G1: the pure-torch flash_attn.bert_padding equals a straightforward reference and keeps gradients."""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.patching.patching_testlib import run_json
from verl_patches.patches.flash_attn import bert_padding as bp


# ---- references: Python loops, no vectorised tricks ---------------------------------------------
def ref_unpad(hidden, mask, unused=None):
    batch, seqlen = mask.shape
    tokens, indices, seqlens, used = [], [], [], []
    for b in range(batch):
        n = u = 0
        for s in range(seqlen):
            valid = bool(mask[b, s])
            if valid or (unused is not None and bool(unused[b, s])):
                tokens.append(hidden[b, s])
                indices.append(b * seqlen + s)
                n += 1
            u += int(valid)
        seqlens.append(n)
        used.append(u)
    cu = [0]
    for n in seqlens:
        cu.append(cu[-1] + n)
    stacked = torch.stack(tokens) if tokens else hidden.new_zeros((0, *hidden.shape[2:]))
    return stacked, indices, cu, max(seqlens), used


def ref_pad(tokens, indices, batch, seqlen):
    out = tokens.new_zeros((batch, seqlen, *tokens.shape[1:]))
    for row, idx in enumerate(indices):
        out[idx // seqlen, idx % seqlen] = tokens[row]
    return out


def ref_concat(hidden, lengths):
    batch, seqlen = lengths.shape
    tokens, indices, seqlens = [], [], []
    for b in range(batch):
        row = [int(x) for x in lengths[b]]
        seqlens += [x for x in row if x]
        for s in range(sum(row)):
            tokens.append(hidden[b, s])
            indices.append(b * seqlen + s)
    cu = [0]
    for n in seqlens:
        cu.append(cu[-1] + n)
    stacked = torch.stack(tokens) if tokens else hidden.new_zeros((0, *hidden.shape[2:]))
    return stacked, indices, cu, max(seqlens) if seqlens else 0


@st.composite
def ragged_batches(draw, with_unused=False):
    batch = draw(st.integers(1, 5))
    seqlen = draw(st.integers(1, 9))
    feature = draw(st.sampled_from([(), (3,), (2, 4)]))
    bits = st.lists(st.booleans(), min_size=seqlen, max_size=seqlen)
    mask = torch.tensor(draw(st.lists(bits, min_size=batch, max_size=batch)), dtype=torch.bool)
    if with_unused:
        extra = torch.tensor(draw(st.lists(bits, min_size=batch, max_size=batch)), dtype=torch.bool)
        unused = extra & ~mask  # allocated but unused slots never overlap valid ones
    else:
        unused = None
    seed = draw(st.integers(0, 2**16))
    hidden = torch.randn((batch, seqlen, *feature), generator=torch.Generator().manual_seed(seed))
    as_int = draw(st.booleans())  # verl passes int64 attention masks; bool must work too
    return hidden, (mask.long() if as_int else mask), unused


def _check_unpad(hidden, mask, unused):
    out = bp.unpad_input(hidden, mask) if unused is None else bp.unpad_input(hidden, mask, unused)
    assert len(out) == 5
    tokens, indices, cu, max_seqlen, used = out
    r_tokens, r_indices, r_cu, r_max, r_used = ref_unpad(hidden, mask, unused)
    assert torch.equal(tokens, r_tokens)
    assert indices.tolist() == r_indices and indices.dtype == torch.int64
    assert cu.tolist() == r_cu and cu.dtype == torch.int32
    assert isinstance(max_seqlen, int) and max_seqlen == r_max
    assert used.tolist() == r_used and used.dtype == torch.int32
    return tokens, indices


@settings(max_examples=60, deadline=None)
@given(ragged_batches())
def test_unpad_input_equals_reference(case):
    hidden, mask, _ = case
    _check_unpad(hidden, mask, None)


@settings(max_examples=60, deadline=None)
@given(ragged_batches(with_unused=True))
def test_unpad_input_with_unused_mask_equals_reference(case):
    hidden, mask, unused = case
    tokens, indices = _check_unpad(hidden, mask, unused)
    # used_seqlens counts only the attention mask; cu_seqlens counts the unused slots too
    assert bp.unpad_input(hidden, mask, unused)[4].tolist() == mask.long().sum(-1).tolist()


@settings(max_examples=60, deadline=None)
@given(ragged_batches())
def test_pad_of_unpad_is_identity_on_valid_tokens_and_zero_elsewhere(case):
    hidden, mask, _ = case
    batch, seqlen = mask.shape
    tokens, indices, *_ = bp.unpad_input(hidden, mask)
    padded = bp.pad_input(tokens, indices, batch, seqlen)
    assert padded.shape == hidden.shape
    valid = mask.bool()
    assert torch.equal(padded[valid], hidden[valid])
    assert torch.count_nonzero(padded[~valid]) == 0
    assert torch.equal(padded, ref_pad(tokens, indices.tolist(), batch, seqlen))


@st.composite
def packed_rows(draw):
    batch = draw(st.integers(1, 4))
    seqlen = draw(st.integers(1, 10))
    rows = []
    for _ in range(batch):
        budget, lengths = draw(st.integers(0, seqlen)), []
        while budget > 0:
            n = draw(st.integers(1, budget))
            lengths.append(n)
            budget -= n
        rows.append(lengths + [0] * (seqlen - len(lengths)))
    hidden = torch.randn(batch, seqlen, 3, generator=torch.Generator().manual_seed(draw(st.integers(0, 999))))
    return hidden, torch.tensor(rows, dtype=torch.int64)


@settings(max_examples=60, deadline=None)
@given(packed_rows())
def test_unpad_for_concatenated_sequences_equals_reference(case):
    hidden, lengths = case
    out = bp.unpad_input_for_concatenated_sequences(hidden, lengths)
    assert len(out) == 4
    tokens, indices, cu, max_seqlen = out
    r_tokens, r_indices, r_cu, r_max = ref_concat(hidden, lengths)
    assert torch.equal(tokens, r_tokens)
    assert indices.tolist() == r_indices
    assert cu.tolist() == r_cu and cu.dtype == torch.int32
    assert max_seqlen == r_max


def test_concatenated_sequences_worked_example():
    hidden = torch.arange(2 * 6, dtype=torch.float32).reshape(2, 6, 1)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [4, 0, 0, 0, 0, 0]])
    tokens, indices, cu, max_seqlen = bp.unpad_input_for_concatenated_sequences(hidden, lengths)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert cu.tolist() == [0, 2, 5, 9] and max_seqlen == 4
    assert tokens.flatten().tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]


def test_worked_example_with_used_seqlens():
    hidden = torch.arange(2 * 4 * 2, dtype=torch.float32).reshape(2, 4, 2)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])
    unused = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0]])
    tokens, indices, cu, max_seqlen, used = bp.unpad_input(hidden, mask, unused)
    assert indices.tolist() == [0, 1, 2, 5, 6, 7]
    assert cu.tolist() == [0, 3, 6] and max_seqlen == 3 and used.tolist() == [2, 3]
    assert tokens.shape == (6, 2)


def test_gradients_flow_through_index_first_axis_and_index_put_first_axis():
    x = torch.randn(6, 3, requires_grad=True)
    idx = torch.tensor([4, 0, 2])
    picked = bp.index_first_axis(x, idx)
    weights = torch.tensor([[1.0], [2.0], [3.0]])
    (picked * weights).sum().backward()
    expected = torch.zeros(6, 3)
    expected[4], expected[0], expected[2] = 1.0, 2.0, 3.0
    assert torch.equal(x.grad, expected)

    v = torch.randn(3, 2, requires_grad=True)
    placed = bp.index_put_first_axis(v, idx, 6)
    assert placed.shape == (6, 2) and torch.equal(placed[idx], v.detach())
    upstream = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    (placed * upstream).sum().backward()
    assert torch.equal(v.grad, upstream[idx])


def test_round_trip_gradient_reaches_only_valid_tokens():
    hidden = torch.randn(2, 5, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]])
    tokens, indices, *_ = bp.unpad_input(hidden, mask)
    bp.pad_input(tokens * 2, indices, 2, 5).sum().backward()
    assert torch.equal(hidden.grad, 2 * mask.unsqueeze(-1).float().expand(2, 5, 4))


def test_signatures_match_flash_attn_2_7():
    names = {
        fn: list(inspect.signature(getattr(bp, fn)).parameters)
        for fn in (
            "index_first_axis",
            "index_put_first_axis",
            "unpad_input",
            "pad_input",
            "unpad_input_for_concatenated_sequences",
        )
    }
    assert names == {
        "index_first_axis": ["input", "indices"],
        "index_put_first_axis": ["values", "indices", "first_axis_dim"],
        "unpad_input": ["hidden_states", "attention_mask", "unused_mask"],
        "pad_input": ["hidden_states", "indices", "batch", "seqlen"],
        "unpad_input_for_concatenated_sequences": ["hidden_states", "attention_mask_in_length"],
    }
    assert inspect.signature(bp.unpad_input).parameters["unused_mask"].default is None
    assert callable(bp.rearrange) and callable(bp.repeat)  # verl imports rearrange from this module


IMPORT_WITHOUT_FLASH_ATTN = r"""
import json, importlib.metadata
try:
    importlib.metadata.version("flash_attn"); installed = True
except importlib.metadata.PackageNotFoundError:
    installed = False
import verl_patches.prelude_patch
from flash_attn.bert_padding import (index_first_axis, index_put_first_axis, pad_input, rearrange, unpad_input,
                                     unpad_input_for_concatenated_sequences)
import verl_patches.patches.flash_attn.bert_padding as ours
print(json.dumps({"installed": installed, "ours": unpad_input is ours.unpad_input and pad_input is ours.pad_input}))
"""


def test_from_flash_attn_bert_padding_import_works_without_flash_attn():
    out, _ = run_json(IMPORT_WITHOUT_FLASH_ATTN, env={"VERL_PATCHES_QUIET": "1"})
    if out["installed"]:
        pytest.skip("flash-attn is installed here: the alias is (correctly) not needed")
    assert out["ours"]
