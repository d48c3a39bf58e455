"""Golden test of the Megatron → rollout weight sync: 8 gloo processes, TP2×PP2×EP2, layers [2, 3], 8 experts.

The ranks (tests/sync/golden_ranks.py) run the real sync; this process feeds each rank's stream to vLLM's
own DeepSeek loader (tests/sync/vllm_receiver.py) and checks:
  * every rollout parameter equals the checkpoint tensor bit for bit, on every rank, after every sync;
  * a rank receives, names and loads only the experts it serves;
  * the rollout's per-token log-probs equal the training model's (its shards reassembled by the reverse
    converter) within 1e-4, before and after an update, and the update changes them;
  * changing one expert of one layer in training changes exactly that expert in the rollout;
  * on the all-to-all path every rank receives exactly the planner's lower bound of bytes.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from tests.reshard.dist_harness import assert_scenario, run_scenario_ranks
from tests.sync import golden_ranks as G
from tests.sync import sync_testlib as L
from tests.sync.vllm_receiver import VllmDeepseekReceiver
from verl_patches.sync.param_table import weights_layout
from verl_patches.sync.plan import SyncPath, build_sync_plan, lower_bound
from verl_patches.weights.hf_schema import hf_tensor_specs
from verl_patches.weights.layout import Rank
from verl_patches.weights.mcore_to_hf import hf_tensor_from_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.timeout(900)]

TAGS_A2A = ("initial", "two_inst", "updated", "one_expert")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("golden_sync")
    results = run_scenario_ranks(functools.partial(G.run_rank, out_dir=str(out)), L.WORLD, timeout_s=800)
    assert_scenario(results, "golden")
    return out


@functools.cache
def _load(out: Path, tag: str, rank: int) -> dict:
    return torch.load(out / f"{tag}_r{rank}.pt")


def _meter(out: Path, tag: str, rank: int) -> dict:
    return json.loads((out / f"{tag}_r{rank}.json").read_text())


@functools.cache
def _hf(seed: int) -> dict:
    return L.hf_state(L.tiny_cfg(), seed)


def expected(tag: str) -> dict[str, torch.Tensor]:
    if tag in ("initial", "initial_ag", "two_inst"):
        return _hf(1)
    hf = dict(_hf(2))
    if tag == "one_expert":
        p = f"model.layers.{G.CHANGED_LAYER}.mlp.experts.{G.CHANGED_EXPERT}."
        for proj in ("gate_proj", "up_proj", "down_proj"):
            hf[p + proj + ".weight"] = hf[p + proj + ".weight"] + 1
    return hf


def rollout_for(tag: str):
    return L.rollout_layout(2 if tag == "two_inst" else L.ROLLOUT_DP)


def receive(out: Path, tag: str, rank: int) -> VllmDeepseekReceiver:
    cfg = L.tiny_cfg()
    owned = rollout_for(tag).owned_experts(rank, cfg["n_routed_experts"])
    rx = VllmDeepseekReceiver(cfg, owned)
    rx.load(list(_load(out, tag, rank)["yielded"].items()))
    return rx


@pytest.mark.parametrize("tag", TAGS_A2A + ("initial_ag",))
def test_every_rollout_parameter_equals_the_checkpoint_bit_for_bit(runs, tag):
    cfg = L.tiny_cfg()
    want = expected(tag)
    for rank in range(L.WORLD):
        rx = receive(runs, tag, rank)
        assert rx.violations == [], (rank, rx.violations)
        owned = rollout_for(tag).owned_experts(rank, cfg["n_routed_experts"])
        names = {n for n in want if ".mlp.experts." not in n}
        names |= {n for n in want if ".mlp.experts." in n and int(n.split(".mlp.experts.")[1].split(".")[0]) in owned}
        got = rx.hf_view()
        assert set(got) == names, (rank, sorted(set(got) ^ names)[:10])
        for n in names:
            assert got[n].dtype == want[n].dtype and torch.equal(got[n], want[n]), (tag, rank, n)


def test_a_rank_is_sent_only_the_experts_it_serves(runs):
    cfg = L.tiny_cfg()
    for tag in TAGS_A2A + ("initial_ag",):
        for rank in range(L.WORLD):
            owned = rollout_for(tag).owned_experts(rank, cfg["n_routed_experts"])
            experts = {
                int(n.split(".mlp.experts.")[1].split(".")[0])
                for n in _load(runs, tag, rank)["yielded"]
                if ".mlp.experts." in n
            }
            assert experts == set(owned), (tag, rank, experts)


def test_all_gather_path_yields_the_same_tensors(runs):
    for rank in range(L.WORLD):
        a, b = _load(runs, "initial", rank)["yielded"], _load(runs, "initial_ag", rank)["yielded"]
        assert a.keys() == b.keys()
        assert all(torch.equal(a[n], b[n]) for n in a)


def test_changing_one_expert_changes_exactly_that_expert_in_the_rollout(runs):
    cfg = L.tiny_cfg()
    owner = [
        r for r in range(L.WORLD) if G.CHANGED_EXPERT in L.rollout_layout().owned_experts(r, cfg["n_routed_experts"])
    ]
    p = f"model.layers.{G.CHANGED_LAYER}.mlp.experts.{G.CHANGED_EXPERT}."
    for rank in range(L.WORLD):
        before, after = _load(runs, "updated", rank)["yielded"], _load(runs, "one_expert", rank)["yielded"]
        assert before.keys() == after.keys()
        changed = {n for n in before if not torch.equal(before[n], after[n])}
        want = {p + f"{proj}.weight" for proj in ("gate_proj", "up_proj", "down_proj")} if rank in owner else set()
        assert changed == want, (rank, changed)
    assert owner, "no rollout rank serves the changed expert"


def actor_hf_state(out: Path, tag: str) -> dict[str, torch.Tensor]:
    """The training model as HF tensors: its shards (as synced) through the reverse converter."""
    cfg, training = L.tiny_cfg(), L.training_layout()
    layout = weights_layout(L.TP, L.PP, L.EP, L.LAYER_LIST)
    by_coords = {}
    for r in range(L.WORLD):
        by_coords.setdefault(L.weights_rank(training, r), r)

    def fetch(rank: Rank, key: str) -> torch.Tensor:
        return _load(out, tag, by_coords[rank])["local"][key]

    return {s.name: hf_tensor_from_ranks(s.name, cfg, layout, fetch) for s in hf_tensor_specs(cfg)}


def rollout_hf_state(out: Path, tag: str) -> dict[str, torch.Tensor]:
    """The rollout instance's weights as HF tensors: each expert from the rank serving it."""
    state = {}
    for rank in range(L.WORLD):
        for n, t in receive(out, tag, rank).hf_view().items():
            state.setdefault(n, t)
    return state


def log_probs(state: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**L.tiny_cfg())).float().eval()
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_rollout_log_probs_equal_the_actor_before_and_after_an_update(runs):
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    per_tag = {}
    for tag in ("initial", "updated"):
        actor = log_probs(actor_hf_state(runs, tag), ids)
        rollout = log_probs(rollout_hf_state(runs, tag), ids)
        assert torch.allclose(actor, rollout, atol=1e-4, rtol=0), (tag, (actor - rollout).abs().max())
        per_tag[tag] = rollout
    assert (per_tag["initial"] - per_tag["updated"]).abs().max() > 1e-2, "the update did not reach the rollout"


def test_all_to_all_path_receives_exactly_the_lower_bound(runs):
    cfg, training = L.tiny_cfg(), L.training_layout()
    for tag, path, rollout in (
        ("initial", SyncPath.ALL_TO_ALL, L.rollout_layout()),
        ("two_inst", SyncPath.ALL_TO_ALL, L.rollout_layout(2)),
        ("initial_ag", SyncPath.ALL_GATHER, L.rollout_layout()),
    ):
        plan = build_sync_plan(cfg, training, rollout, L.LAYER_LIST, path=path)
        for rank in range(L.WORLD):
            lb, m = lower_bound(plan, rank), _meter(runs, tag, rank)
            if path is SyncPath.ALL_TO_ALL:
                assert m["received"] == lb.received, (tag, rank, m, lb)
            else:
                assert m["received"] > lb.received, (tag, rank, m, lb)
            assert m["peak"] >= lb.peak_extra
