"""E1 lifecycle with a recording rollout and model; MLA absorbed matrices rebuilt after every load."""

from __future__ import annotations

import pytest
import torch

from verl_patches.rollout.lifecycle import rebuild_mla
from verl_patches.sync.sharding_manager import SWITCH_TIME_ATTR, MegatronRolloutShardingManager


class FakeMLAImpl:
    """Derives W_UV / W_UK_T from kv_b_proj exactly as vllm-ascend's AscendMLAImpl does (mla_v1.py)."""

    def __init__(self, log, heads=2, nope=3, v=4, lora=5):
        self.log, self.heads, self.nope, self.v, self.lora = log, heads, nope, v, lora
        self.kv_b_proj = torch.nn.Linear(lora, heads * (nope + v), bias=False)
        self.seen_cleared = []
        self.process_weights_after_loading(None)
        self.log.clear()

    def process_weights_after_loading(self, act_dtype):
        self.log.append("process_weights_after_loading")
        self.seen_cleared.append(getattr(self, "W_UV", None) is None and getattr(self, "W_UK_T", None) is None)
        w = self.kv_b_proj.weight.T.view(self.lora, self.heads, self.nope + self.v)
        w_uk, w_uv = w.split([self.nope, self.v], dim=-1)
        self.W_UV = w_uv.transpose(0, 1).contiguous()
        self.W_UK_T = w_uk.permute(1, 2, 0).contiguous()


class FakeModel(torch.nn.Module):
    def __init__(self, log, layers=2):
        super().__init__()
        self.log = log
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList()
        self.impls = []
        for _ in range(layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Module()
            layer.self_attn.mla_attn = torch.nn.Module()
            impl = FakeMLAImpl(log)
            layer.self_attn.mla_attn.impl = impl
            self.impls.append(impl)
            self.model.layers.append(layer)

    def load_weights(self, weights):
        self.log.append("load_weights")
        names = set()
        for name, t in weights:
            layer = int(name.split(".")[2])
            self.impls[layer].kv_b_proj.weight.data.copy_(t)
            names.add(name)
        return names


class FakeRollout:
    def __init__(self, log, model):
        self.log, self.model = log, model

    def onload_model_weights(self):
        self.log.append("onload")

    def free_cache_engine(self):
        self.log.append("free_cache")

    def offload_model_weights(self):
        self.log.append("offload")


class FakeChunk:
    def __init__(self, log):
        self.log = log

    def train(self):
        self.log.append("train")


def make(log, weights):
    model = FakeModel(log)
    manager = MegatronRolloutShardingManager(
        [FakeChunk(log)],
        rollout=FakeRollout(log, model),
        weights_fn=lambda m: (log.append("generator"), weights)[1],
        prepare_model=lambda m: log.append("prepare"),
        empty_cache=lambda: log.append("empty_cache"),
        infer_tp=(1, 0, None),
    )
    return manager, model


def new_kv_b(seed):
    g = torch.Generator().manual_seed(seed)
    return [(f"model.layers.{i}.self_attn.kv_b_proj.weight", torch.randn(14, 5, generator=g)) for i in range(2)]


def test_enter_and_exit_call_the_rollout_lifecycle_in_order():
    log = []
    manager, _ = make(log, new_kv_b(0))
    with manager:
        assert log == [
            "generator",
            "onload",
            "prepare",
            "load_weights",
            "process_weights_after_loading",
            "process_weights_after_loading",
        ]
        log.clear()
    assert log == ["free_cache", "offload", "train", "empty_cache"]
    assert manager.loaded_params == 2 and manager.mla_layers_rebuilt == 2
    assert getattr(manager, SWITCH_TIME_ATTR) >= 0


def test_absorbed_matrices_follow_the_new_kv_b_proj_after_every_load():
    log = []
    for seed in (1, 2):
        manager, model = make(log, new_kv_b(seed))
        stale = [impl.W_UV.clone() for impl in model.impls]
        with manager:
            pass
        for impl, (_, w), old in zip(model.impls, new_kv_b(seed), stale):
            assert impl.seen_cleared[-1], "process_weights_after_loading must see the derived matrices cleared"
            want = w.T.view(5, 2, 7).split([3, 4], dim=-1)[1].transpose(0, 1)
            assert torch.equal(impl.W_UV, want) and not torch.equal(impl.W_UV, old)


def test_rebuild_skips_layers_without_mla_and_counts_the_rest():
    log = []
    model = FakeModel(log, layers=3)
    model.model.layers[1].self_attn = torch.nn.Module()  # e.g. a PP-missing layer
    assert rebuild_mla(model) == 2


def test_a_rollout_hook_replaces_the_generic_mla_walk():
    log = []
    manager, _ = make(log, new_kv_b(0))
    manager.rollout.rebuild_mla_absorbed = lambda: (log.append("rollout hook"), 2)[1]
    with manager:
        pass
    assert "rollout hook" in log and "process_weights_after_loading" not in log


def test_a_rollout_lifecycle_with_load_weights_loads_and_rebuilds_itself():
    log = []
    manager, model = make(log, new_kv_b(0))
    manager.rollout.load_weights = lambda weights: (log.append("lifecycle load"), model.load_weights(weights))[1]
    with manager:
        pass
    assert log.index("lifecycle load") < log.index("load_weights") and "process_weights_after_loading" not in log
    assert manager.mla_layers_rebuilt is None


def test_without_a_rollout_object_it_uses_vllm_wake_up_and_sleep():
    log = []
    model = FakeModel(log)

    class Engine:
        def wake_up(self, tags):
            log.append(("wake_up", tuple(tags)))

        def sleep(self, level):
            log.append(("sleep", level))

    engine = Engine()
    engine.llm_engine = type("E", (), {})()
    engine.llm_engine.model_executor = type("X", (), {})()
    engine.llm_engine.model_executor.driver_worker = type("D", (), {})()
    engine.llm_engine.model_executor.driver_worker.worker = type("W", (), {})()
    engine.llm_engine.model_executor.driver_worker.worker.model_runner = type("R", (), {"model": model})()
    manager = MegatronRolloutShardingManager(
        [FakeChunk(log)],
        inference_engine=engine,
        weights_fn=lambda m: new_kv_b(0),
        prepare_model=lambda m: None,
        empty_cache=lambda: None,
        infer_tp=(1, 0, None),
    )
    with manager:
        pass
    assert log[0] == ("wake_up", ("weights",)) and ("sleep", 1) in log


def test_postprocess_keeps_this_tp_ranks_chunk():
    from verl.protocol import DataProto

    manager = MegatronRolloutShardingManager([], rollout=None, infer_tp=(2, 1, None))
    data = DataProto.from_dict(tensors={"x": torch.arange(4)})
    assert manager.postprocess_data(data).batch["x"].tolist() == [2, 3]


def test_a_failed_load_propagates_and_still_records_the_switch_time():
    log = []
    manager, _ = make(log, [("model.layers.9.self_attn.kv_b_proj.weight", torch.zeros(14, 5))])
    with pytest.raises(IndexError):
        manager.__enter__()
    assert "process_weights_after_loading" not in log and hasattr(manager, SWITCH_TIME_ATTR)
