"""MC2's HCCL_BUFFSIZE rules (launch/preflight/mc2_buffer.py): each documented A3 rule's least admissible value, checked
against the rule's own inequality over the whole input space, by hand at the A3 profiles' sizes, and its
refusal of sizes that are not positive integers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_patches.launch.preflight.mc2_buffer import (
    MB,
    Mc2Sizes,
    align,
    dispatch_v1_buffsize_mb,
    dispatch_v2_buffsize_mb,
    dispatch_v2_bytes,
    required_buffsize_mb,
)

sizes = st.builds(
    Mc2Sizes,
    bs=st.integers(1, 512),
    hidden=st.integers(1, 16384),
    top_k=st.integers(1, 16),
    ep_world_size=st.integers(1, 768),
    local_expert_num=st.integers(1, 1024),
    shared_expert_num=st.integers(0, 4),
)


def v1_admits(s: Mc2Sizes, buffsize: int) -> bool:
    """The dispatch page's A3 rule as written: >= 2 and 1024^2 * (B - 2) / 2 >= BS*2*(H+128)*(EP*local+K+1)."""
    need = s.bs * 2 * (s.hidden + 128) * (s.ep_world_size * s.local_expert_num + s.top_k + 1)
    return buffsize >= 2 and 1024**2 * (buffsize - 2) // 2 >= need


def v2_admits(s: Mc2Sizes, buffsize: int) -> bool:
    """The dispatch_v2 page's A3 rule as written, with Align as a ceiling: >= 2 and B MB >= 2 * (...) bytes."""

    def align512(x: int) -> int:
        return math.ceil(x / 512) * 512

    def align32(x: int) -> int:
        return math.ceil(x / 32) * 32

    need = 2 * (
        s.local_expert_num * s.bs * s.ep_world_size * align512(align32(2 * s.hidden) + 64)
        + (s.top_k + s.shared_expert_num) * s.bs * align512(2 * s.hidden)
    )
    return buffsize >= 2 and buffsize * 1024 * 1024 >= need


@given(sizes)
def test_each_rule_gives_its_least_admissible_buffsize(s: Mc2Sizes) -> None:
    for least, admits in ((dispatch_v1_buffsize_mb(s), v1_admits), (dispatch_v2_buffsize_mb(s), v2_admits)):
        assert admits(s, least) and not admits(s, least - 1)
        assert admits(s, least + 1)  # both rules are monotone in the setting


@given(sizes)
def test_the_requirement_is_the_larger_rule_and_says_which(s: Mc2Sizes) -> None:
    need, rule = required_buffsize_mb(s)
    v1, v2 = dispatch_v1_buffsize_mb(s), dispatch_v2_buffsize_mb(s)
    assert need == max(v1, v2) and v1_admits(s, need) and v2_admits(s, need)
    assert rule.startswith("npu_moe_distribute_dispatch_v2's" if v2 >= v1 else "npu_moe_distribute_dispatch's")
    assert f"{v1} MB" in rule and f"{v2} MB" in rule


@given(sizes, st.sampled_from(["bs", "hidden", "top_k", "ep_world_size", "local_expert_num", "shared_expert_num"]))
def test_more_of_any_size_never_needs_less(s: Mc2Sizes, name: str) -> None:
    bigger = Mc2Sizes(**{**s.__dict__, name: getattr(s, name) + 1})
    assert required_buffsize_mb(bigger)[0] >= required_buffsize_mb(s)[0]
    assert dispatch_v2_bytes(bigger) >= dispatch_v2_bytes(s)


@given(st.integers(0, 10**6), st.sampled_from([32, 480, 512]))
def test_align_is_the_next_multiple(x: int, to: int) -> None:
    assert align(x, to) % to == 0 and x <= align(x, to) < x + to


def meta_v2_rows(bs: int, k: int, ep_world_size: int, moe_expert_num: int, global_bs: int) -> int:
    """`a` of torch_npu 2.5.1.post1's npu_moe_distribute_dispatch_v2_meta (op_plugin/meta/_meta_registrations.py)
    for the arguments vllm-ascend passes: expert_shard_type 0, shared_expert_rank_num 0, a MoE expert rank."""
    global_bs_real = bs * ep_world_size if global_bs == 0 else global_bs
    local_moe_expert_num = moe_expert_num // (ep_world_size - 0)
    return global_bs_real * min(local_moe_expert_num, k)


@given(sizes)
def test_receive_rows_are_the_dispatch_v2_meta_functions_a(s: Mc2Sizes) -> None:
    moe_expert_num = s.local_expert_num * s.ep_world_size
    for global_bs in (0, s.bs * s.ep_world_size):  # vllm-ascend passes BS x EP; 0 means the same
        assert s.receive_rows == meta_v2_rows(s.bs, s.top_k, s.ep_world_size, moe_expert_num, global_bs)


@pytest.mark.parametrize(
    "bs, ep, local, v1, v2, v2_bytes, rows",
    [
        # a3_256die_true_weight: max_num_seqs 64 over rollout TP2, EP = TP2 x DP64 = 128, 256/128 experts
        (32, 128, 2, 239, 240, 2 * (2 * 32 * 128 * 14848 + 9 * 32 * 14336), 8192),
        # a3_256die_random_init: EP256, one expert per rank
        (32, 256, 1, 239, 240, 2 * (1 * 32 * 256 * 14848 + 9 * 32 * 14336), 8192),
        # a3_16die_smoke: max_num_seqs 32 over TP2, EP16, 16 experts per rank
        (16, 16, 16, 121, 120, 2 * (16 * 16 * 16 * 14848 + 9 * 16 * 14336), 2048),
    ],
)
def test_the_a3_profiles_sizes_by_hand(bs, ep, local, v1, v2, v2_bytes, rows) -> None:
    # H 7168: Align512(Align32(2H) + 64) = Align512(14400) = 29 x 512 = 14848, Align512(2H) = 14336; K + 1 shared = 9
    s = Mc2Sizes(bs=bs, hidden=7168, top_k=8, ep_world_size=ep, local_expert_num=local)
    # v1: (B - 2) x 2^19 >= BS x 2 x 7296 x (EP x local + 9); e.g. 32 x 2 x 7296 x 265 = 123740160 -> 236.02 -> 237
    assert dispatch_v1_buffsize_mb(s) == v1
    assert dispatch_v2_bytes(s) == v2_bytes and dispatch_v2_buffsize_mb(s) == v2 == math.ceil(v2_bytes / MB)
    assert required_buffsize_mb(s)[0] == max(v1, v2) <= 300  # the job's HCCL_BUFFSIZE holds every profile
    assert s.receive_rows == rows


@pytest.mark.parametrize(
    "field, value",
    [("bs", 0), ("hidden", -1), ("top_k", True), ("ep_world_size", 2.0), ("local_expert_num", None)],
)
def test_sizes_that_are_not_positive_integers_are_refused_by_name(field, value) -> None:
    args = dict(bs=1, hidden=7168, top_k=8, ep_world_size=16, local_expert_num=1) | {field: value}
    with pytest.raises(ValueError, match=f"MC2 size {field}="):
        Mc2Sizes(**args)
    with pytest.raises(ValueError, match="shared_expert_num"):
        Mc2Sizes(bs=1, hidden=1, top_k=1, ep_world_size=1, local_expert_num=1, shared_expert_num=-1)
