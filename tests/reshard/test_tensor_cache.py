"""D2D tensor cache: preconditions, explicit overwrite, clear, size report, reshard on get.

The step flow (generate → ref → update) runs on a fake worker group of 8 in-process workers whose
collective is simulated from the same DP re-layout plan the real executor uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.reshard.sim import simulate_all_to_all
from verl_patches.reshard.errors import (
    PlanMismatchError,
    TensorCacheKeyExistsError,
    TensorCacheMissingKeyError,
    TensorCachePreconditionError,
)
from verl_patches.reshard.layout import MegatronLayout
from verl_patches.reshard.tensor_cache import TensorCache, check_tensor_cache_preconditions, global_rollout_rows

DataProto = pytest.importorskip("verl.protocol", reason="vendored verl needed").DataProto

GOOD = {
    "data": {"train_batch_size": 4},
    "actor_rollout_ref": {"actor": {"use_kl_loss": True}, "rollout": {"n": 4}},
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "trainer": {"balance_batch": False},
}


def config(**overrides):
    cfg = OmegaConf.create(GOOD)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


def test_good_config_passes_and_sizes_the_batch():
    check_tensor_cache_preconditions(config())
    assert global_rollout_rows(config()) == 16


@pytest.mark.parametrize(
    "key,value",
    [
        ("actor_rollout_ref.actor.use_kl_loss", False),
        ("algorithm.use_kl_in_reward", True),
        ("algorithm.adv_estimator", "gae"),
        ("trainer.balance_batch", True),
    ],
)
def test_each_violation_names_its_key(key, value):
    cfg = config()
    OmegaConf.update(cfg, key, value)
    with pytest.raises(TensorCachePreconditionError) as e:
        check_tensor_cache_preconditions(cfg)
    assert list(e.value.violations) == [key]
    assert key in str(e.value)


def test_missing_key_is_a_violation():
    cfg = config()
    del cfg.trainer["balance_batch"]
    with pytest.raises(TensorCachePreconditionError) as e:
        check_tensor_cache_preconditions(cfg)
    assert "trainer.balance_batch: missing" in str(e.value)


def test_verl_default_megatron_config_is_rejected_with_every_key():
    path = Path("verl/trainer/config/ppo_megatron_trainer.yaml")
    if not path.exists():
        pytest.skip("vendored verl tree absent")
    cfg = OmegaConf.load(path)
    with pytest.raises(TensorCachePreconditionError) as e:
        check_tensor_cache_preconditions(cfg)
    assert set(e.value.violations) == {
        "actor_rollout_ref.actor.use_kl_loss",
        "algorithm.adv_estimator",
        "trainer.balance_batch",
    }
    for key, value in [
        ("actor_rollout_ref.actor.use_kl_loss", True),
        ("algorithm.adv_estimator", "grpo"),
        ("trainer.balance_batch", False),
    ]:
        OmegaConf.update(cfg, key, value)
    check_tensor_cache_preconditions(cfg)


def single_rank_cache() -> TensorCache:
    return TensorCache(MegatronLayout(1, tp=1, pp=1), rank=0, global_rows=4)


def test_put_requires_explicit_overwrite():
    cache = single_rank_cache()
    cache.put("x", torch.zeros(4, 2))
    with pytest.raises(TensorCacheKeyExistsError) as e:
        cache.put("x", torch.ones(4, 2))
    assert "overwrite=True" in str(e.value) and e.value.key == "x"
    assert torch.equal(cache.get_tensor("x"), torch.zeros(4, 2))
    cache.put("x", torch.ones(4, 2), overwrite=True)
    assert torch.equal(cache.get_tensor("x"), torch.ones(4, 2))
    with pytest.raises(PlanMismatchError):
        cache.put("y", torch.zeros(3, 2))


def test_cache_tensors_pops_reserves_skips_and_is_all_or_nothing():
    cache = single_rank_cache()
    data = DataProto.from_dict({k: torch.full((4, 3), i) for i, k in enumerate(["a", "b", "c", "d"])})
    cache.cache_tensors(data, keys_to_reserve=["b"], keys_no_cache=["d"])
    assert sorted(data.batch.keys()) == ["b", "d"] and sorted(cache.keys()) == ["a", "b", "c"]
    again = DataProto.from_dict({"c": torch.zeros(4, 3), "e": torch.zeros(4, 3)})
    with pytest.raises(TensorCacheKeyExistsError):
        cache.cache_tensors(again)
    assert "e" not in cache and sorted(again.batch.keys()) == ["c", "e"]  # nothing half-done
    cache.cache_tensors(again, overwrite=True)
    assert torch.equal(cache.get_tensor("c"), torch.zeros(4, 3))


def test_missing_key_names_the_cached_keys():
    cache = single_rank_cache()
    cache.put("responses", torch.zeros(4, 1))
    with pytest.raises(TensorCacheMissingKeyError) as e:
        cache.get(["ref_log_prob"])
    assert "ref_log_prob" in str(e.value) and "responses" in str(e.value)


def test_size_report_and_clear():
    cache = single_rank_cache()
    cache.put("a", torch.zeros(4, 8, dtype=torch.int64))
    cache.put("b", torch.zeros(4, 2, dtype=torch.bfloat16))
    report = cache.size_report()
    assert report.bytes_per_key == {"a": 256, "b": 16} and report.total_bytes == 272
    assert "2 keys" in str(report)
    cache.clear()
    assert len(cache) == 0 and cache.size_report().total_bytes == 0


class FakeWorkerGroup:
    """Workers of one process each, with a collective simulated from the DP re-layout plan."""

    def __init__(self, layout: MegatronLayout, cfg):
        self.layout = layout
        self.workers = [
            TensorCache.from_config(cfg, layout, r, group=self, relayout=self._relayout)
            for r in range(layout.world_size)
        ]
        self._pending: dict[str, list[torch.Tensor]] = {}
        self.collectives = 0

    def _relayout(self, plan, rank, tensor, group):
        assert group is self
        cache = self.workers[rank]
        (key,) = [k for k in cache.keys() if cache.peek(k)[0] is tensor]
        if key not in self._pending:
            sources = [w.peek(key)[0] for w in self.workers]
            self._pending[key] = simulate_all_to_all(plan.all_exchanges(), sources)
            self.collectives += 1
        return self._pending[key][rank]

    def generate(self, chunks: list[dict[str, torch.Tensor]]) -> DataProto:
        outs = []
        for cache, chunk in zip(self.workers, chunks):
            data = DataProto.from_dict(dict(chunk))
            cache.cache_tensors(data, keys_to_reserve=["responses", "attention_mask"], keys_no_cache=["prompts"])
            outs.append(data)
        return DataProto.concat(outs)

    def compute_ref_log_prob(self) -> list[DataProto]:
        outs = []
        for cache in self.workers:
            batch = cache.get(["responses", "input_ids", "attention_mask", "position_ids"])
            cache.put("ref_log_prob", batch.batch["input_ids"].float() * 0.5, layout="megatron_dp")
            outs.append(batch)
        return outs

    def update_actor(self, advantages: torch.Tensor) -> list[DataProto]:
        outs = []
        for r, cache in enumerate(self.workers):
            batch = cache.get(["responses", "input_ids", "attention_mask", "position_ids", "ref_log_prob"])
            n = batch.batch.batch_size[0]
            d = self.layout.dp_rank(r)
            batch = batch.union(DataProto.from_dict({"advantages": advantages[d * n : (d + 1) * n]}))
            outs.append(batch)
            cache.clear()
        return outs


def test_step_flow_on_a_fake_worker_group():
    layout = MegatronLayout(8, tp=2, pp=2, order="tp-cp-ep-dp-pp")  # dp = 2
    wg = FakeWorkerGroup(layout, config())
    keys = ["prompts", "responses", "input_ids", "attention_mask", "position_ids"]
    chunks = [
        {
            k: torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(10 * r + i))
            for i, k in enumerate(keys)
        }
        for r in range(8)
    ]
    to_driver = wg.generate(chunks)
    assert sorted(to_driver.batch.keys()) == ["attention_mask", "prompts", "responses"]
    full = {k: torch.cat([c[k] for c in chunks]) for k in keys}

    ref_inputs = wg.compute_ref_log_prob()
    assert wg.collectives == 4
    for r, batch in enumerate(ref_inputs):
        d = layout.dp_rank(r)
        for k in ["responses", "input_ids", "attention_mask", "position_ids"]:
            assert torch.equal(batch.batch[k], full[k].chunk(2)[d]), (r, k)
    assert all(w.size_report().total_bytes > 0 for w in wg.workers)

    advantages = torch.arange(16.0)
    update_inputs = wg.update_actor(advantages)
    assert wg.collectives == 4  # entries were already in the Megatron layout
    for r, batch in enumerate(update_inputs):
        d = layout.dp_rank(r)
        assert torch.equal(batch.batch["ref_log_prob"], full["input_ids"].chunk(2)[d].float() * 0.5)
        assert torch.equal(batch.batch["advantages"], advantages.chunk(2)[d])
    assert all(len(w) == 0 for w in wg.workers)
