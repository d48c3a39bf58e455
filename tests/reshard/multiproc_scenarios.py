"""Scenarios run on every rank of an 8-process gloo world (see test_executors_multiproc.py).

Each scenario checks the executor's result against an all-gather-then-slice reference computed with
plain collectives in the same run, and the bytes the executor handed to the collective against the cost
model's prediction for that rank.
"""

from __future__ import annotations

import zlib
from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from tests.reshard.dist_harness import run_scenarios
from verl_patches.reshard.cost_model import dp_plan_cost, ep_plan_cost, pp_plan_cost
from verl_patches.reshard.dp_plan import plan_dp_relayout
from verl_patches.reshard.ep_plan import ExpertDims, ExpertWeight, plan_expert_reshard
from verl_patches.reshard.errors import PlanMismatchError, TensorCacheKeyExistsError
from verl_patches.reshard.executors import gather_pipeline_params, relayout_rows, reshard_expert_weight
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout
from verl_patches.reshard.model_dims import ModelDims, deepseek_v3_stage_params
from verl_patches.reshard.pp_plan import global_name, layer_offsets, plan_pp_gather
from verl_patches.reshard.rollout_experts import rollout_expert_tensors
from verl_patches.reshard.tensor_cache import TensorCache


def gather_uneven(t: torch.Tensor, sizes: list[int], group=None) -> list[torch.Tensor]:
    """Reference all-gather of dim-0-uneven tensors (pad to the largest, gather, trim)."""
    m = max(sizes)
    pad = t.new_zeros((m, *t.shape[1:]))
    pad[: t.shape[0]] = t
    outs = [torch.empty_like(pad) for _ in sizes]
    dist.all_gather(outs, pad, group=group)
    return [o[:n] for o, n in zip(outs, sizes)]


def new_groups(groups: list[list[int]], rank: int):
    """Create every group (all ranks must), return the one containing ``rank``."""
    mine = None
    for g in groups:
        pg = dist.new_group(g)
        if rank in g:
            mine = pg
    return mine


def sent_received(records) -> tuple[int, int]:
    return (sum(r.bytes_sent_to_peers for r in records), sum(r.bytes_received_from_peers for r in records))


# ------------------------------------------------------------------------------------------------- DP


def dp_case(rank: int, world: int, *, order: str, tp: int, pp: int, rows: list[int], dtype: torch.dtype):
    lay = MegatronLayout(world, tp, pp, order=order)
    plan = plan_dp_relayout(lay, rows)
    g = torch.Generator().manual_seed(rank)
    if dtype.is_floating_point:
        local = torch.randn((rows[rank], 3, 2), generator=g).to(dtype)
    else:
        local = torch.randint(0, 1000, (rows[rank], 3, 2), generator=g, dtype=dtype)
    records = []
    out = relayout_rows(plan, rank, local, group=None, recorder=records.append)
    ref = torch.cat(gather_uneven(local, rows)).chunk(lay.dp)[lay.dp_rank(rank)]
    assert out.dtype == ref.dtype and torch.equal(out, ref), (out, ref)
    cost = dp_plan_cost(plan, row_bytes=6 * local.element_size()).per_rank[rank]
    assert sent_received(records) == (cost.sent, cost.received), (sent_received(records), cost)
    assert len(records) == 1


# ------------------------------------------------------------------------------------------------- EP


def hf_experts(num_experts: int, dims: ExpertDims):
    g = torch.Generator().manual_seed(1234)
    gate = torch.randn((num_experts, dims.ffn, dims.hidden), generator=g).to(torch.bfloat16)
    up = torch.randn((num_experts, dims.ffn, dims.hidden), generator=g).to(torch.bfloat16)
    down = torch.randn((num_experts, dims.hidden, dims.ffn), generator=g).to(torch.bfloat16)
    return gate, up, down


def megatron_param(kind: ExpertWeight, gate, up, down, experts: range, dims: ExpertDims) -> torch.Tensor:
    if kind is ExpertWeight.WEIGHT1:
        blocks = torch.stack([torch.cat([gate[e].t(), up[e].t()], dim=1) for e in experts])
    else:
        blocks = torch.stack([down[e].t() for e in experts])
    return blocks.contiguous().view(dims.training_param_shape(kind, len(experts)))


def ep_case(
    rank: int,
    world: int,
    *,
    training: dict,
    rollout: dict,
    num_experts: int,
    holder_stage: int | None,
    policy: str = "balanced",
    rounds: str = "per_instance",
    tp_ep_group: bool = False,
):
    dims = ExpertDims(hidden=4, ffn=3)
    tr, ro = MegatronLayout(world, **training), RolloutLayout(world, **rollout)
    plan = plan_expert_reshard(tr, ro, num_experts, holder_stage, policy, rounds)
    group = new_groups(tr.rank_groups("tp-ep", independent_ep=True), rank) if tp_ep_group else None
    gate, up, down = hf_experts(num_experts, dims)
    n_local = tr.local_experts(num_experts)
    for kind in ExpertWeight:
        shape = dims.expert_shape(kind)
        held = plan.held(rank)
        weight = megatron_param(kind, gate, up, down, held, dims) if len(held) else None
        records = []
        got = reshard_expert_weight(
            plan, rank, kind, dims, weight, dtype=torch.bfloat16, group=group, recorder=records.append
        )
        # all-gather-then-slice reference over the world
        units = (
            weight.view(n_local, *shape) if weight is not None else torch.zeros((n_local, *shape), dtype=torch.bfloat16)
        )
        gathered = [torch.empty_like(units) for _ in range(world)]
        dist.all_gather(gathered, units)
        full = {}
        for r in range(world):
            if len(plan.held(r)):
                for i, e in enumerate(plan.held(r)):
                    full.setdefault(e, gathered[r][i])
        owned = ro.owned_experts(rank, num_experts)
        assert sorted(got.experts) == list(owned)
        for e in owned:
            assert torch.equal(got.experts[e], full[e]), (kind, e)
        for e, proj, t in rollout_expert_tensors(kind, got.experts, num_experts, dims.ffn):
            if e in owned:
                want = {"gate_proj": gate, "up_proj": up, "down_proj": down}[proj][e]
                assert torch.equal(t, want), (e, proj)
            else:
                assert t.numel() == 0
        cost = ep_plan_cost(plan, dims, kind).per_rank[rank]
        assert sent_received(records) == (cost.sent, cost.received), (sent_received(records), cost)
        assert got.buffer_bytes == cost.receive_buffer
        assert got.buffer_bytes <= len(owned) * dims.expert_numel(kind) * 2  # ≤ owned experts, never E
        assert len(records) == plan.num_rounds


def ep_group_missing_peers_case(rank: int, world: int):
    """A TP×EP group cannot carry an owner-stage plan: every rank refuses before any collective."""
    dims = ExpertDims(hidden=4, ffn=3)
    tr, ro = MegatronLayout(world, **EP_TRAIN), RolloutLayout(world, 2, 4)
    plan = plan_expert_reshard(tr, ro, 8, holder_stage=1)
    group = new_groups(tr.rank_groups("tp-ep", independent_ep=True), rank)
    held = plan.held(rank)
    weight = torch.zeros(dims.training_param_shape(ExpertWeight.WEIGHT1, len(held))) if len(held) else None
    try:
        reshard_expert_weight(plan, rank, ExpertWeight.WEIGHT1, dims, weight, torch.float32, group=group)
    except PlanMismatchError as exc:
        assert "is not in the process group" in str(exc)
    else:
        raise AssertionError("a plan peer outside the group must be refused")


# ------------------------------------------------------------------------------------------------- PP

TINY = ModelDims(
    hidden=4,
    moe_ffn=2,
    num_experts=4,
    num_layers=6,
    first_k_dense=1,
    dense_ffn=6,
    num_heads=2,
    q_lora_rank=3,
    kv_lora_rank=2,
    qk_nope_head_dim=2,
    qk_rope_head_dim=1,
    v_head_dim=2,
    n_shared_experts=1,
    vocab_size=10,
)


def value_for(name: str, shape, dtype: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g).to(getattr(torch, dtype))


def pp_case(rank: int, world: int, *, layer_list: list[int], bucket_bytes: int | None):
    pp = len(layer_list)
    lay = MegatronLayout(world, tp=world // pp, pp=pp)
    stages = [deepseek_v3_stage_params(TINY, layer_list, s) for s in range(pp)]
    plan = plan_pp_gather(stages, layer_list, bucket_bytes)
    stage = lay.pp_rank(rank)
    group = new_groups(lay.rank_groups("pp"), rank)
    off = layer_offsets(layer_list)[stage]
    tensors = {p.name: value_for(global_name(p.name, off), p.shape, p.dtype) for p in stages[stage]}
    records = []
    got = list(gather_pipeline_params(plan, stage, tensors, group, rank, records.append))
    names = [n for n, _ in got]
    assert len(names) == len(set(names))
    objs = [None] * pp
    dist.all_gather_object(objs, {global_name(n, off): tensors[n] for n in plan.eligible[stage]}, group=group)
    ref = {k: v for o in objs for k, v in o.items()}
    assert set(names) == set(ref)
    for n, t in got:
        assert t.dtype == ref[n].dtype and torch.equal(t, ref[n]), n
    cost = pp_plan_cost(plan, world)
    assert sent_received(records)[1] == cost.per_rank[rank].received
    assert len(records) == cost.calls == len(plan.buckets)


# ------------------------------------------------------------------------------------------ cache

CACHE_CONFIG = {
    "data": {"train_batch_size": 4},
    "actor_rollout_ref": {"actor": {"use_kl_loss": True}, "rollout": {"n": 4}},
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "trainer": {"balance_batch": False},
}


def cache_case(rank: int, world: int):
    # DataProto itself is exercised in test_tensor_cache.py; importing verl in 8 processes would
    # triple this file's run time, and cache_tensors only needs a ``.batch`` mapping.
    lay = MegatronLayout(world, tp=2, pp=2)  # dp = 2, global batch 16 rows, 2 per rank
    calls = []

    def counting_relayout(*args, **kwargs):
        calls.append(1)
        return relayout_rows(*args, **kwargs)

    cache = TensorCache.from_config(OmegaConf.create(CACHE_CONFIG), lay, rank, relayout=counting_relayout)
    g = torch.Generator().manual_seed(100 + rank)
    local = {
        k: torch.randint(0, 50, (2, 5), generator=g)
        for k in ("prompts", "responses", "input_ids", "attention_mask", "position_ids")
    }
    data = SimpleNamespace(batch=dict(local))
    cache.cache_tensors(data, keys_to_reserve=["responses", "attention_mask"], keys_no_cache=["prompts"])
    assert set(data.batch) == {"prompts", "responses", "attention_mask"}
    assert sorted(cache.keys()) == ["attention_mask", "input_ids", "position_ids", "responses"]
    keys = ["responses", "input_ids", "attention_mask", "position_ids"]
    for k in keys:
        got = cache.get_tensor(k)
        ref = torch.cat(gather_uneven(local[k], [2] * world)).chunk(lay.dp)[lay.dp_rank(rank)]
        assert torch.equal(got, ref), k
        assert cache.layout_of(k) == "megatron_dp"
    assert len(calls) == 4
    cache.put("ref_log_prob", torch.zeros(8, 5), layout="megatron_dp")
    for k in keys + ["ref_log_prob"]:
        cache.get_tensor(k)
    assert len(calls) == 4  # already resharded: no second collective
    try:
        cache.put("input_ids", torch.zeros(8, 5, dtype=torch.long), layout="megatron_dp")
        raise AssertionError("overwrite without overwrite=True must raise")
    except TensorCacheKeyExistsError:
        pass
    report = cache.size_report()
    assert report.bytes_per_key["ref_log_prob"] == 8 * 5 * 4 and report.total_bytes == 4 * 8 * 5 * 8 + 160
    cache.clear()
    assert len(cache) == 0


# ------------------------------------------------------------------------------------------ all

EP_TRAIN = dict(tp=2, pp=2, ep=2)  # TP×EP = 4, two stages of 4 ranks

SCENARIOS = {
    "dp_contiguous_uneven_bf16": partial(
        dp_case, order="tp-cp-ep-dp-pp", tp=2, pp=2, rows=[3, 0, 1, 2, 0, 5, 1, 4], dtype=torch.bfloat16
    ),
    "dp_non_contiguous_int64": partial(
        dp_case, order="dp-tp-pp", tp=2, pp=1, rows=[0, 4, 1, 3, 2, 2, 0, 4], dtype=torch.int64
    ),
    "dp_pp_first_order": partial(dp_case, order="pp-dp-tp", tp=2, pp=2, rows=[2] * 8, dtype=torch.float32),
    "ep_owner_stage_one_instance": partial(
        ep_case, training=EP_TRAIN, rollout=dict(tp=2, dp_per_instance=4), num_experts=8, holder_stage=1
    ),
    "ep_owner_stage_two_instances": partial(
        ep_case, training=EP_TRAIN, rollout=dict(tp=2, dp_per_instance=2), num_experts=8, holder_stage=0
    ),
    "ep_two_instances_single_round_packed": partial(
        ep_case,
        training=EP_TRAIN,
        rollout=dict(tp=2, dp_per_instance=2),
        num_experts=8,
        holder_stage=0,
        rounds="single",
    ),
    "ep_uneven_vllm_remainder": partial(
        ep_case, training=EP_TRAIN, rollout=dict(tp=1, dp_per_instance=8), num_experts=12, holder_stage=1
    ),
    "ep_rollout_ep_below_training": partial(
        ep_case, training=dict(tp=2, pp=1, ep=4), rollout=dict(tp=2, dp_per_instance=1), num_experts=16, holder_stage=0
    ),
    "ep_tp_ep_group_after_broadcast": partial(
        ep_case,
        training=EP_TRAIN,
        rollout=dict(tp=2, dp_per_instance=4),
        num_experts=8,
        holder_stage=None,
        policy="tp_ep_group",
        tp_ep_group=True,
    ),
    "ep_non_contiguous_order": partial(
        ep_case,
        training=dict(EP_TRAIN, order="ep-dp-tp-pp"),
        rollout=dict(tp=2, dp_per_instance=2),
        num_experts=8,
        holder_stage=None,
        policy="tp_ep_group",
        tp_ep_group=True,
    ),
    "ep_group_missing_peers_is_refused": ep_group_missing_peers_case,
    "pp_buckets": partial(pp_case, layer_list=[1, 2, 2, 1], bucket_bytes=64),
    "pp_one_param_per_call": partial(pp_case, layer_list=[3, 3], bucket_bytes=None),
    "tensor_cache": cache_case,
}


def run_all(rank: int, world: int) -> dict[str, str]:
    return run_scenarios(SCENARIOS, rank, world)
