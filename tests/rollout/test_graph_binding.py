"""The rollout lifecycle under TorchAir's frozen-parameter contract, and the sampling stream across KV re-inits.

The graph is built by vllm-ascend's own `NPUModelRunner._get_torchair_lazy_compiled_model` (frozen_parameter
True, `torch.compile(..., fullgraph=True)`) on the emulated TorchAir backend, which raises
`FrozenParameterMoved` where TorchAir on A3 would silently keep reading a parameter's old address. The KV
re-init goes through vLLM's own `Executor.initialize_from_config` and vllm-ascend's own
`NPUWorker.compile_or_warm_up_model` (graph re-capture, then `set_random_seed`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch


class TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(6, 8)
        self.down = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))

    def load_weights(self, weights):  # vLLM's default loader: copy into the parameter's storage
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            params[name].data.copy_(w)
            loaded.add(name)
        return loaded


@pytest.fixture()
def runner_cls(monkeypatch):
    import vllm_ascend.worker.model_runner_v1 as mr

    monkeypatch.setattr(
        mr,
        "get_ascend_config",
        lambda: SimpleNamespace(torchair_graph_config=SimpleNamespace(enable_view_optimize=False)),
    )
    return mr.NPUModelRunner


def build_engine(runner_cls) -> tuple[Any, Any]:
    """A rollout engine with the attribute paths of vLLM's LLM, whose model runner compiles through
    vllm-ascend's code and whose KV init runs vLLM's executor and vllm-ascend's worker code."""
    from vllm.v1.executor.abstract import Executor
    from vllm_ascend.worker.worker_v1 import NPUWorker

    torch.manual_seed(0)
    model = TinyModel()
    runner = SimpleNamespace(
        model=model,
        use_cached_npu_graph=False,
        torchair_graph_batch_sizes=[4],
        torchair_compiled_model=None,
        torchair_compiled_models={},
        kv_caches=[],
        torchair_graph_enabled=True,
        captures=0,
    )
    runner.graph = lambda batch: runner_cls._get_torchair_lazy_compiled_model(runner, batch)
    runner.decode = lambda x: runner.graph(4)(x)

    def capture_model() -> None:  # what capture_model does per graph batch size: run the compiled graph once
        runner.captures += 1
        runner.decode(torch.zeros(4, 6))

    runner.capture_model = capture_model
    runner.eplb_warmup = lambda: None
    worker = SimpleNamespace(
        model_runner=runner,
        model_config=SimpleNamespace(enforce_eager=False, seed=0),
        vllm_config=SimpleNamespace(compilation_config=SimpleNamespace(compile_sizes=[])),
    )

    def initialize_from_config(configs) -> None:  # vLLM's WorkerWrapperBase picks this rank's config
        runner.kv_caches = [torch.zeros(configs[0].num_blocks, 2)]

    worker.initialize_from_config = initialize_from_config
    worker.compile_or_warm_up_model = lambda: NPUWorker.compile_or_warm_up_model(worker)
    executor = SimpleNamespace(collective_rpc=lambda name, args=(): [getattr(worker, name)(*args)])
    executor.initialize_from_config = lambda configs: Executor.initialize_from_config(executor, configs)
    core = SimpleNamespace(model_executor=executor, kv_cache_configs=[SimpleNamespace(num_blocks=3)])
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner))),
            engine_core=SimpleNamespace(engine_core=core),
            vllm_config=None,
        )
    )
    executor.initialize_from_config(core.kv_cache_configs)  # LLM(...): first KV init + graph capture
    return llm, runner


def new_weights(model: torch.nn.Module, scale: float) -> dict[str, torch.Tensor]:
    return {n: torch.randn_like(p) * scale for n, p in model.named_parameters()}


def reference(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    ref = TinyModel()
    ref.load_state_dict(state)
    return ref(x)


def test_the_emulated_torchair_refuses_a_moved_frozen_parameter_by_name(runner_cls) -> None:
    from torchair._graph_mode import FrozenParameterMoved

    llm, runner = build_engine(runner_cls)
    assert runner.captures == 1 and runner.torchair_compiled_model is not None
    runner.model.down.weight.data = runner.model.down.weight.data.clone()  # what a rebinding lifecycle does
    with pytest.raises(FrozenParameterMoved, match=r"down\.weight"):
        runner.decode(torch.zeros(4, 6))


def test_each_step_decodes_with_that_steps_weights_under_frozen_parameters(runner_cls) -> None:
    from verl_patches.rollout.lifecycle import RolloutLifecycle

    llm, runner = build_engine(runner_cls)
    life = RolloutLifecycle(llm, device="cpu")
    life.free_cache_engine()  # verl's sleep(level=1) right after the build
    life.offload_model_weights()
    x = torch.randn(4, 6)
    for step in range(3):
        state = new_weights(runner.model, 1.0 + step)
        life.onload_model_weights()  # train -> rollout: new storage for every parameter
        life.load_weights(state.items())
        life.init_cache_engine()  # KV re-init (its warm-up captures the graphs again)
        with torch.no_grad():
            torch.testing.assert_close(runner.decode(x), reference(state, x))
        life.free_cache_engine()
        life.offload_model_weights()
    assert runner.captures == 4  # the build, then one capture per step, each on that step's addresses


def test_graphs_are_kept_when_the_weights_did_not_move(runner_cls) -> None:
    from verl_patches.rollout.graph_binding import forget_graphs_if_moved, record

    llm, runner = build_engine(runner_cls)
    record(runner)
    compiled = runner.torchair_compiled_model
    with torch.no_grad():
        runner.model.up.weight.mul_(2)  # written in place: same storage
    assert forget_graphs_if_moved(runner) == [] and runner.torchair_compiled_model is compiled
    runner.model.up.bias.data = runner.model.up.bias.data.clone()
    assert forget_graphs_if_moved(runner) == ["up.bias"] and runner.torchair_compiled_model is None


def test_each_step_samples_a_new_stream_and_a_resume_restores_it(runner_cls) -> None:
    """vllm-ascend's warm-up after every KV init calls set_random_seed(seed): without the fix every step's
    sampling noise (the default generator vLLM samples from) was the same."""
    from verl_patches.checkpoint import rng
    from verl_patches.rollout.lifecycle import RolloutLifecycle

    llm, runner = build_engine(runner_cls)
    life = RolloutLifecycle(llm, device="cpu")
    draws, saved = [], None
    for step in range(3):
        life.free_cache_engine()
        if step == 2:
            saved = rng.capture()  # what a checkpoint after step 2's training holds
        life.init_cache_engine()
        draws.append(torch.rand(8))  # the step's sampling
    assert all(not torch.equal(a, b) for a, b in zip(draws, draws[1:]))
    assert runner.captures == 4  # the warm-up (and its re-seed) really ran at every re-init
    torch.manual_seed(1234)  # a resumed process starts elsewhere ...
    rng.restore(saved, "test")  # ... restores the checkpoint's streams ...
    life.free_cache_engine()
    life.init_cache_engine()  # ... and its first KV init keeps them
    torch.testing.assert_close(torch.rand(8), draws[2], rtol=0, atol=0)


@pytest.mark.parametrize("rank, tp, want", [(0, 1, 7), (3, 1, 10), (0, 2, 7), (1, 2, 7), (2, 2, 8), (255, 2, 134)])
def test_every_engine_has_its_own_seed_and_every_rank_of_one_engine_the_same(rank, tp, want) -> None:
    from verl_patches.rollout.engine_factory import rollout_llm_kwargs

    kw = rollout_llm_kwargs({"seed": 7, "tensor_parallel_size": tp}, {"RANK": str(rank)})
    assert kw["seed"] == want
    seeds = {
        r: rollout_llm_kwargs({"seed": 0, "tensor_parallel_size": 2}, {"RANK": str(r)})["seed"] for r in range(256)
    }
    assert len(set(seeds.values())) == 128 and all(seeds[r] == seeds[r ^ 1] for r in range(256))
