"""Layout model: Megatron RankGenerator semantics, TP-extend-EP expert blocks, the vLLM rollout layout."""

from __future__ import annotations

import itertools
import warnings

import pytest

from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import (
    MegatronLayout,
    RolloutLayout,
    masked_rank_groups,
    production_rollout_layout,
    production_training_layout,
)

ORDERS = [
    "tp-cp-ep-dp-pp",
    "tp-dp-pp",
    "tp-pp-dp",
    "pp-dp-tp",
    "tp-cp-dp-ep-pp",
    "ep-dp-tp-pp-cp",
    "cp-tp-ep-dp-pp",
    "dp-ep-pp-cp-tp",
]
TOKENS = [
    ("tp", False),
    ("pp", False),
    ("dp", False),
    ("cp", False),
    ("dp-cp", False),
    ("tp-pp", False),
    ("tp-dp", False),
    ("tp-dp-cp", False),
    ("tp-ep", True),
    ("ep", True),
    ("dp", True),
    ("tp-ep-pp", True),
    ("dp-cp", True),
]


def small_layouts():
    for order, tp, pp, cp, ep, dpm in itertools.product(ORDERS, [1, 2, 4], [1, 2, 3], [1, 2], [1, 2, 4], [1, 3]):
        try:
            yield MegatronLayout(tp * pp * cp * ep * dpm, tp, pp, ep, cp, order)
        except InvalidLayoutError:
            continue


def test_rank_groups_match_megatron_rank_generator():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_state = pytest.importorskip(
            "megatron.core.parallel_state", reason="vendored megatron.core needed for the reference"
        )
    checked = 0
    for lay in small_layouts():
        ref = parallel_state.RankGenerator(tp=lay.tp, ep=lay.ep, dp=lay.dp, pp=lay.pp, cp=lay.cp, order=lay.order)
        for token, independent_ep in TOKENS:
            try:
                expected = ref.get_ranks(token, independent_ep)
            except (ValueError, IndexError, RuntimeError):
                continue  # token names an axis this order lacks
            assert lay.rank_groups(token, independent_ep) == expected, (lay, token, independent_ep)
            checked += 1
    assert checked > 3000


def test_layouts_megatron_rejects_are_rejected_with_named_condition():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_state = pytest.importorskip("megatron.core.parallel_state")
    for order in ["tp-ep-pp-dp", "tp-pp-dp"]:
        with pytest.raises(RuntimeError):
            parallel_state.RankGenerator(tp=2, ep=2, dp=2, pp=2, cp=1, order=order)
    with pytest.raises(InvalidLayoutError) as e:
        MegatronLayout(16, tp=2, pp=2, ep=2, order="tp-ep-pp-dp")
    assert e.value.condition == "ep_adjacent_to_dp"
    with pytest.raises(InvalidLayoutError) as e:
        MegatronLayout(16, tp=2, pp=2, ep=2, order="tp-pp-dp")
    assert e.value.condition == "order_names_every_axis" and "ep has size 2" in str(e.value)


@pytest.mark.parametrize(
    "kwargs,condition",
    [
        (dict(world_size=24, tp=4, pp=4), "world_divisible_by_tp_pp_cp"),
        (dict(world_size=32, tp=4, pp=2, ep=3), "dp_divisible_by_ep"),
        (dict(world_size=16, tp=2, pp=2, order="tp-xx-dp-pp"), "order_tokens"),
        (dict(world_size=16, tp=2, pp=2, order="tp-dp-dp-pp"), "order_tokens"),
        (dict(world_size=16, tp=0, pp=2), "positive_size"),
    ],
)
def test_invalid_training_layouts(kwargs, condition):
    with pytest.raises(InvalidLayoutError) as e:
        MegatronLayout(**kwargs)
    assert e.value.condition == condition
    assert condition in str(e.value)


def test_coordinates_agree_with_groups_for_every_layout():
    for lay in small_layouts():
        for group in lay.rank_groups("dp"):
            assert [lay.dp_rank(r) for r in group] == list(range(lay.dp))
        for group in lay.rank_groups("pp"):
            assert [lay.pp_rank(r) for r in group] == list(range(lay.pp))
        for group in lay.rank_groups("ep", independent_ep=True):
            assert [lay.coords(r).ep for r in group] == list(range(lay.ep))
        for group in lay.rank_groups("tp"):
            assert [lay.coords(r).tp for r in group] == list(range(lay.tp))


def test_expert_blocks_cover_every_expert_once_per_tp_ep_group():
    for lay in small_layouts():
        for group in lay.rank_groups("tp-ep", independent_ep=True):
            assert sorted(lay.expert_block(r) for r in group) == list(range(lay.tp_ep_size))
            # MindSpeed's moe_tp_extend_ep offset: (ep_rank * tp + tp_rank) * E_local
            for r in group:
                c = lay.coords(r)
                assert lay.experts_of_rank(r, 4 * lay.tp_ep_size).start == (c.ep * lay.tp + c.tp) * 4
            assert lay.tp_ep_group(group[0]) == tuple(group)


def test_production_training_layout():
    lay = production_training_layout()
    assert (lay.dp, lay.tp_ep_size) == (8, 32)
    assert lay.rank_groups("tp-ep", independent_ep=True) == [list(range(32 * s, 32 * s + 32)) for s in range(8)]
    assert lay.rank_groups("dp")[1] == [1, 5, 9, 13, 17, 21, 25, 29]
    assert lay.rank_groups("pp")[0] == [32 * s for s in range(8)]
    assert lay.stage_ranks(3) == list(range(96, 128))
    assert lay.experts_of_rank(37, 256) == range(40, 48)


def test_non_contiguous_order_with_tp_gt_1():
    # dp before tp: TP groups are strided, TP×EP groups are not consecutive ranks.
    lay = MegatronLayout(16, tp=2, pp=2, ep=2, order="ep-dp-tp-pp")
    assert lay.rank_groups("tp")[0] == [0, 4]
    assert lay.rank_groups("tp-ep", independent_ep=True)[0] == [0, 1, 4, 5]
    assert lay.dp_rank(5) == 1 and lay.coords(5).tp == 1 and lay.expert_block(5) == 3


def test_masked_rank_groups_example_from_megatron_docstring():
    assert masked_rank_groups([2, 3, 4], [False, True, False])[0] == [0, 2, 4]
    assert masked_rank_groups([2, 3, 4], [False, True, False])[7] == [19, 21, 23]


def test_rollout_layouts():
    one, two = production_rollout_layout(128), production_rollout_layout(64)
    assert (one.num_instances, one.ep_size, two.num_instances, two.ep_size) == (1, 256, 2, 128)
    assert two.instance_of(200) == 1 and two.ep_rank(200) == 72
    assert two.owned_experts(200, 256) == range(144, 146)
    assert one.owned_experts(255, 256) == range(255, 256)
    with pytest.raises(InvalidLayoutError) as e:
        RolloutLayout(world_size=12, tp=2, dp_per_instance=4)
    assert e.value.condition == "world_divisible_by_rollout_instance"
    with pytest.raises(InvalidLayoutError) as e:
        RolloutLayout(8, 2, 4).owned_experts(0, 6)
    assert e.value.condition == "rollout_ep_at_most_num_experts"


@pytest.mark.usefixtures("vllm_job_process")
def test_rollout_ownership_matches_vllm_determine_expert_map():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm.model_executor.layers.fused_moe.layer import determine_expert_map
    for ep, experts in [(2, 8), (3, 8), (4, 16), (8, 8), (5, 13), (128, 256)]:
        lay = RolloutLayout(ep, 1, ep)
        for r in range(ep):
            _, emap = determine_expert_map(ep, r, experts)
            owned = [e for e in range(experts) if int(emap[e]) >= 0]
            assert owned == list(lay.owned_experts(r, experts)), (ep, experts, r)
