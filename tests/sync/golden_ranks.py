"""What each of the 8 gloo ranks of the golden weight-sync test does (spawned by test_golden_sync.py).

Per rank: build its Megatron shards, then run the real sync several times and save what the sync yielded
(and the shards it synced from) for the parent, which checks them with vLLM's loader:

  initial      all-to-all path, rollout EP8 (one instance, the A3 random-init layout scaled down)
  initial_ag   the all-gather path (``NO_ALL_TO_ALL_RESHARD=1``) on the same weights
  two_inst     all-to-all path, two rollout instances of EP4 (the A3 true-weight layout scaled down)
  updated      after an in-place update of every shard (a new checkpoint copied into the parameters)
  one_expert   after changing expert ``CHANGED_EXPERT`` of layer ``CHANGED_LAYER`` only
"""

from __future__ import annotations

import json
import os

import torch

from tests.sync import sync_testlib as L
from verl_patches.reshard.pp_plan import layer_offsets, stage_of_layer
from verl_patches.sync.generator import SyncMeter, iter_rollout_weights
from verl_patches.sync.plan import SyncPath, build_sync_plan

CHANGED_LAYER, CHANGED_EXPERT = 3, 5


def _save(out_dir: str, tag: str, rank: int, got: dict, local: dict, meter: SyncMeter) -> None:
    torch.save(
        {"yielded": got, "local": {k: v.clone() for k, v in local.items()}}, os.path.join(out_dir, f"{tag}_r{rank}.pt")
    )
    with open(os.path.join(out_dir, f"{tag}_r{rank}.json"), "w") as f:
        json.dump({"sent": meter.sent, "received": meter.received, "peak": meter.peak_extra, "calls": meter.calls}, f)


def _sync(plan, rank, local, groups) -> tuple[dict, SyncMeter]:
    meter = SyncMeter()
    got = {}
    for name, t in iter_rollout_weights(plan, rank, local, groups, meter):
        if name in got:
            raise AssertionError(f"rank {rank}: {name} yielded twice")
        got[name] = t.clone()
    return got, meter


def change_one_expert(local: dict, training, rank: int, cfg: dict) -> None:
    """Add 1 to expert CHANGED_EXPERT of layer CHANGED_LAYER (gate, up and down) where a rank holds it."""
    stage = stage_of_layer(L.LAYER_LIST, CHANGED_LAYER)
    if training.pp_rank(rank) != stage:
        return
    held = training.experts_of_rank(rank, cfg["n_routed_experts"])
    if CHANGED_EXPERT not in held:
        return
    local_layer = CHANGED_LAYER - layer_offsets(L.LAYER_LIST)[stage]
    i = CHANGED_EXPERT - held.start
    h, f = cfg["hidden_size"], cfg["moe_intermediate_size"]
    w1 = local[f"decoder.layers.{local_layer}.mlp.experts.weight1"]
    w2 = local[f"decoder.layers.{local_layer}.mlp.experts.weight2"]
    w1.view(len(held), h, 2 * f)[i].add_(1)
    w2.view(len(held), f, h)[i].add_(1)


def run_rank(rank: int, world: int, out_dir: str) -> dict[str, str]:
    torch.manual_seed(0)
    cfg = L.tiny_cfg()
    training = L.training_layout()
    local = L.rank_state(cfg, L.hf_state(cfg, 1), training, rank)
    groups = L.make_groups(training, rank)
    a2a = build_sync_plan(cfg, training, L.rollout_layout(), L.LAYER_LIST, path=SyncPath.ALL_TO_ALL)
    ag = build_sync_plan(cfg, training, L.rollout_layout(), L.LAYER_LIST, path=SyncPath.ALL_GATHER)
    two = build_sync_plan(cfg, training, L.rollout_layout(2), L.LAYER_LIST, path=SyncPath.ALL_TO_ALL)

    for tag, plan in (("initial", a2a), ("initial_ag", ag), ("two_inst", two)):
        got, meter = _sync(plan, rank, local, groups)
        _save(out_dir, tag, rank, got, local, meter)

    # an update in place, as an optimizer step leaves the parameters: same tensors, new values
    new = L.rank_state(cfg, L.hf_state(cfg, 2), training, rank)
    for k, v in local.items():
        v.copy_(new[k])
    got, meter = _sync(a2a, rank, local, groups)
    _save(out_dir, "updated", rank, got, local, meter)

    change_one_expert(local, training, rank, cfg)
    got, meter = _sync(a2a, rank, local, groups)
    _save(out_dir, "one_expert", rank, got, local, meter)
    return {"golden": "ok"}
