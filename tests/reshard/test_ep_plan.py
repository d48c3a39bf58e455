"""Expert routing planner: right experts on every rollout rank, from real holders, at the byte bound."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reshard.sim import simulate_all_to_all
from verl_patches.reshard.cost_model import ep_lower_bound, ep_plan_cost
from verl_patches.reshard.ep_plan import (
    ExpertDims,
    ExpertWeight,
    check_vendor_alltoallv_constraints,
    plan_expert_reshard,
)
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.exchange import SendStaging
from verl_patches.reshard.executors import collect_experts
from verl_patches.reshard.layout import (
    MegatronLayout,
    RolloutLayout,
    production_rollout_layout,
    production_training_layout,
)
from verl_patches.reshard.rollout_experts import (
    expert_param_name,
    named_rollout_expert_tensors,
    rollout_expert_slots,
    rollout_expert_tensors,
)

ORDERS = ["tp-cp-ep-dp-pp", "ep-dp-tp-pp-cp", "cp-tp-dp-ep-pp", "pp-tp-ep-dp-cp"]
DIMS = ExpertDims(hidden=3, ffn=2)


def hf_experts(num_experts: int, dims: ExpertDims, seed: int = 0):
    """Random per-expert HF tensors: gate/up [ffn, hidden], down [hidden, ffn]."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_experts, dims.ffn, dims.hidden)
    gate, up = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    down = torch.randn((num_experts, dims.hidden, dims.ffn), generator=g)
    return gate, up, down


def megatron_param(kind, gate, up, down, experts: range, dims: ExpertDims) -> torch.Tensor:
    """Build a rank's grouped-GEMM parameter from HF tensors by the documented convention."""
    if kind is ExpertWeight.WEIGHT1:
        blocks = torch.stack([torch.cat([gate[e].t(), up[e].t()], dim=1) for e in experts])
    else:
        blocks = torch.stack([down[e].t() for e in experts])
    return blocks.contiguous().view(dims.training_param_shape(kind, len(experts)))


def simulate(plan, kind, gate, up, down, dims=DIMS):
    """Run the plan in-process; return per-rank {expert: block} exactly as the executor indexes it."""
    world = plan.training.world_size
    units = []
    for r in range(world):
        held = plan.held(r)
        if len(held):
            units.append(megatron_param(kind, gate, up, down, held, dims).view(len(held), *dims.expert_shape(kind)))
        else:
            units.append(torch.empty((0, *dims.expert_shape(kind))))
    got = [dict() for _ in range(world)]
    for rnd in range(plan.num_rounds):
        exchanges = plan.exchanges(rnd)
        outs = simulate_all_to_all(exchanges, units)
        for ex, out in zip(exchanges, outs):
            collect_experts(ex, plan.needed(ex.rank), out, units[ex.rank], got[ex.rank])
    return got


@st.composite
def cases(draw):
    while True:
        tp, pp, cp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2]))
        ep, dpm = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
        try:
            training = MegatronLayout(tp * pp * cp * ep * dpm, tp, pp, ep, cp, draw(st.sampled_from(ORDERS)))
            break
        except InvalidLayoutError:
            continue
    world = training.world_size
    num_experts = training.tp_ep_size * draw(st.integers(1, 3))
    sizes = [n for n in range(1, world + 1) if world % n == 0 and n <= num_experts]
    instance = draw(st.sampled_from(sizes))
    rtp = draw(st.sampled_from([d for d in (1, 2) if instance % d == 0]))
    rollout = RolloutLayout(world, rtp, instance // rtp)
    holder_stage = draw(st.one_of(st.none(), st.integers(0, training.pp - 1)))
    policy = (
        draw(st.sampled_from(["balanced", "tp_ep_group"])) if (holder_stage is None or training.pp == 1) else "balanced"
    )
    rounds = draw(st.sampled_from(["per_instance", "single"]))
    return training, rollout, num_experts, holder_stage, policy, rounds


@settings(max_examples=120, deadline=None)
@given(cases(), st.sampled_from(list(ExpertWeight)))
def test_every_rollout_rank_gets_exactly_its_experts_from_holders(case, kind):
    training, rollout, num_experts, holder_stage, policy, rounds = case
    plan = plan_expert_reshard(training, rollout, num_experts, holder_stage, policy, rounds)
    gate, up, down = hf_experts(num_experts, DIMS)
    got = simulate(plan, kind, gate, up, down)
    for g in range(rollout.world_size):
        owned = rollout.owned_experts(g, num_experts)
        assert sorted(got[g]) == list(owned)
        entries = rollout_expert_tensors(kind, got[g], num_experts, DIMS.ffn)
        assert [(e, p) for e, p, _ in entries] == [(e, p) for e, p, _ in rollout_expert_slots(kind, num_experts, owned)]
        for e, proj, t in entries:
            if e not in owned:
                assert t.numel() == 0
                continue
            want = {"gate_proj": gate, "up_proj": up, "down_proj": down}[proj][e]
            assert torch.equal(t, want), (g, e, proj)
    for t in plan.transfers:
        held = plan.held(t.src)
        assert held.start <= t.first_expert and t.first_expert + t.count <= held.stop
        if policy == "tp_ep_group":
            assert t.src in training.tp_ep_group(t.dst)
    # received bytes per rank equal the lower bound, for every rank
    ours = ep_plan_cost(plan, DIMS, kind)
    bound = ep_lower_bound(training, rollout, num_experts, DIMS, kind, holder_stage)
    assert [c.received for c in ours.per_rank] == [c.received for c in bound.per_rank]
    assert ours.max_sent >= bound.max_sent


@pytest.mark.parametrize("vllm_dp", [128, 64])
@pytest.mark.parametrize("holder_stage", [0, 3, 7, None])
def test_production_layouts_hit_the_bound(vllm_dp, holder_stage):
    training, rollout = production_training_layout(), production_rollout_layout(vllm_dp)
    dims = ExpertDims(hidden=7168, ffn=2048)
    plan = plan_expert_reshard(training, rollout, 256, holder_stage)
    for kind in ExpertWeight:
        ours = ep_plan_cost(plan, dims, kind)
        bound = ep_lower_bound(training, rollout, 256, dims, kind, holder_stage)
        assert [c.received for c in ours.per_rank] == [c.received for c in bound.per_rank]
        assert ours.max_sent == bound.max_sent
        assert ours.max_peak_extra == bound.max_peak_extra
        assert all(c.staging == 0 for c in ours.per_rank)
    assert plan.num_rounds == rollout.num_instances
    # every instance gets every expert exactly once
    for i in range(rollout.num_instances):
        got = sorted(
            e
            for t in plan.transfers
            if rollout.instance_of(t.dst) == i
            for e in range(t.first_expert, t.first_expert + t.count)
        )
        assert got == list(range(256))


def test_vendor_example_small_plan():
    # vendor CPU test: ep_train=4, ep_roll=8, E=16, after the PP broadcast, own-group routing
    training = MegatronLayout(8, tp=2, pp=1, ep=2)
    rollout = RolloutLayout(8, 2, 4)
    plan = plan_expert_reshard(training, rollout, 16, None, "tp_ep_group")
    for g in range(8):
        assert [(t.first_expert, t.count) for t in plan.received_from(g)] == [(2 * g, 2)]
    # per-rank send ≤ one shard (4 experts)
    assert max(sum(t.count for t in plan.transfers if t.src == r and t.dst != r) for r in range(8)) <= 4


def test_rollout_ep_below_training_width_is_supported():
    # The vendor requires rollout EP to be a multiple of training TP×EP; our routing does not.
    training, rollout = production_training_layout(), RolloutLayout(256, 2, 8)  # 16 instances, EP16
    with pytest.raises(InvalidLayoutError) as e:
        check_vendor_alltoallv_constraints(training, rollout, 256)
    assert e.value.condition == "rollout_ep_multiple_of_training_ep"
    assert "rollout EP 16 is not a multiple of training TP×EP 32" in str(e.value)
    plan = plan_expert_reshard(training, rollout, 256, 2)
    assert [(t.first_expert, t.count) for t in plan.received_from(17)] == [(16, 8), (24, 8)]


def test_vendor_constraints_reject_non_consecutive_groups():
    training = MegatronLayout(16, tp=2, pp=2, ep=2, order="ep-dp-tp-pp")
    with pytest.raises(InvalidLayoutError) as e:
        check_vendor_alltoallv_constraints(training, RolloutLayout(16, 2, 8), 16)
    assert e.value.condition == "training_tp_ep_groups_consecutive"
    plan = plan_expert_reshard(training, RolloutLayout(16, 2, 8), 16, None, "tp_ep_group")
    assert all(t.src in training.tp_ep_group(t.dst) for t in plan.transfers)


@pytest.mark.parametrize(
    "kwargs,condition",
    [
        (dict(num_experts=22), "experts_divisible_by_training_tp_ep"),
        (dict(num_experts=16, rollout=RolloutLayout(32, 2, 16)), "rollout_ep_at_most_num_experts"),
        (dict(num_experts=32, rollout=RolloutLayout(16, 2, 8)), "same_world_size"),
        (dict(num_experts=32, holder_stage=1, source_policy="tp_ep_group"), "tp_ep_group_needs_every_stage"),
        (dict(num_experts=32, source_policy="nearest"), "source_policy"),
    ],
)
def test_invalid_expert_layouts(kwargs, condition):
    args = dict(training=MegatronLayout(32, tp=2, pp=2, ep=2), rollout=RolloutLayout(32, 2, 4), holder_stage=None)
    args.update(kwargs)
    with pytest.raises(InvalidLayoutError) as e:
        plan_expert_reshard(**args)
    assert e.value.condition == condition and condition in str(e.value)


def test_staging_decisions():
    # Holder in the middle of its own receivers: routing its own expert through the collective keeps
    # the send side a view (no pack buffer).
    training, rollout = production_training_layout(), production_rollout_layout(128)
    plan = plan_expert_reshard(training, rollout, 256, 1)
    ex = plan.rank_exchange(36, 0)  # rank 36 holds experts 32..39 and needs expert 36
    assert ex.staging is SendStaging.VIEW_WITH_SELF and ex.staging_units == 0
    assert ex.receive_buffer_units == 1 and ex.units_received == 0
    single = plan_expert_reshard(training, production_rollout_layout(64), 256, 1, round_policy="single")
    assert single.rank_exchange(32, 0).staging is SendStaging.PACK  # same experts to both instances


def test_expert_param_names_for_vllm():
    assert expert_param_name(5, 17, "up_proj") == "model.layers.5.mlp.experts.17.up_proj.weight"
    blocks = {1: torch.arange(12.0).view(3, 4)}  # hidden 3, ffn 2: gate‖up
    named = named_rollout_expert_tensors(5, rollout_expert_tensors(ExpertWeight.WEIGHT1, blocks, 2, 2))
    assert [n for n, _ in named] == [
        f"model.layers.5.mlp.experts.{e}.{p}.weight" for e in (0, 1) for p in ("gate_proj", "up_proj")
    ]
    assert named[0][1].numel() == 0 and named[2][1].shape == (2, 3)
    assert torch.equal(named[3][1], blocks[1][:, 2:].t())


def test_same_grouped_gemm_convention_as_the_weight_converter():
    """Ranks built by the checkpoint converter (verl_patches.weights) reshard back to the HF tensors."""
    layout_mod = pytest.importorskip("verl_patches.weights.tensor_layout", reason="weight converter module not present")

    class DictSource:
        def __init__(self, tensors):
            self.t = tensors

        def get(self, name):
            return self.t[name]

        def rows(self, name, start, stop):
            return self.t[name][start:stop]

        def cols(self, name, start, stop):
            return self.t[name][:, start:stop]

        def shape(self, name):
            return tuple(self.t[name].shape)

        def dtype(self, name):
            return self.t[name].dtype

    num_experts, dims = 8, ExpertDims(hidden=5, ffn=3)
    gate, up, down = hf_experts(num_experts, dims, seed=7)
    src = DictSource(
        {
            **{f"g{e}": gate[e] for e in range(8)},
            **{f"u{e}": up[e] for e in range(8)},
            **{f"d{e}": down[e] for e in range(8)},
        }
    )
    training, rollout = MegatronLayout(4, tp=2, pp=1, ep=2), RolloutLayout(4, 2, 1)  # 2 instances, EP2
    plan = plan_expert_reshard(training, rollout, num_experts, holder_stage=0)
    for kind in ExpertWeight:
        units = []
        for r in range(4):
            held = plan.held(r)
            if kind is ExpertWeight.WEIGHT1:
                w = layout_mod.build_grouped_w1(src, [(f"g{e}", f"u{e}") for e in held], 1, 0)
            else:
                w = layout_mod.build_grouped_w2(src, [f"d{e}" for e in held], 1, 0)
            assert tuple(w.shape) == dims.training_param_shape(kind, len(held))
            units.append(w.view(len(held), *dims.expert_shape(kind)))
        got = [dict() for _ in range(4)]
        outs = simulate_all_to_all(plan.exchanges(0), units), simulate_all_to_all(plan.exchanges(1), units)
        for rnd, out in enumerate(outs):
            for ex, o in zip(plan.exchanges(rnd), out):
                collect_experts(ex, plan.needed(ex.rank), o, units[ex.rank], got[ex.rank])
        for r in range(4):
            for e, proj, t in rollout_expert_tensors(kind, got[r], num_experts, dims.ffn):
                if t.numel():
                    assert torch.equal(t, {"gate_proj": gate, "up_proj": up, "down_proj": down}[proj][e])
