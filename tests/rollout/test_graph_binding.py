"""The rollout lifecycle and TorchAir's frozen parameters, and the sampling stream across KV re-inits.

Graphs are built by vllm-ascend's `NPUModelRunner._get_torchair_lazy_compiled_model` (`torch.compile(...,
fullgraph=True)`) on the emulated TorchAir backend, which raises `FrozenParameterMoved` where TorchAir on A3
would silently keep reading a frozen parameter's old address. Two builders: upstream's own (frozen_parameter
True; taken from the patch registry's record of the original), where the lifecycle must rebuild the graphs
whenever the weights moved, and the one our patch `vllm_ascend.model_runner_v1.torchair_unfrozen_parameters`
installs (upstream's method recompiled with frozen_parameter False), where the weights are graph inputs and
one graph serves every step. The KV re-init goes through vLLM's own `Executor.initialize_from_config` and
vllm-ascend's own `NPUWorker.compile_or_warm_up_model` (graph re-capture, then `set_random_seed`)."""

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


UNFROZEN = "vllm_ascend.model_runner_v1.torchair_unfrozen_parameters"


def upstream_graph_builder():
    """vllm-ascend's own `_get_torchair_lazy_compiled_model` (frozen parameters), as the registry found it."""
    from verl_patches.patching.registry import get_registry

    registry = get_registry()
    assert registry is not None, "the prelude's registry is not active in this process"
    rec = next(r for r in registry.records if r.patch.name == UNFROZEN)
    assert rec.status.startswith("applied"), (rec.status, rec.detail)
    return rec.original


@pytest.fixture(params=["upstream", "patched"])
def runner_cls(request, monkeypatch):
    import vllm_ascend.worker.model_runner_v1 as mr

    monkeypatch.setattr(
        mr,
        "get_ascend_config",
        lambda: SimpleNamespace(torchair_graph_config=SimpleNamespace(enable_view_optimize=False)),
    )
    if request.param == "upstream":
        cls = type("UpstreamNPUModelRunner", (mr.NPUModelRunner,), {})
        cls._get_torchair_lazy_compiled_model = upstream_graph_builder()
        return cls
    return mr.NPUModelRunner


def frozen(runner_cls) -> bool:
    from verl_patches.rollout.graph_binding import graphs_freeze_parameters

    return graphs_freeze_parameters(runner_cls.__new__(runner_cls))


def build_engine(runner_cls) -> tuple[Any, Any]:
    """A rollout engine with the attribute paths of vLLM's LLM, whose model runner compiles through
    vllm-ascend's code and whose KV init runs vLLM's executor and vllm-ascend's worker code."""
    from vllm.v1.executor.abstract import Executor
    from vllm_ascend.worker.worker_v1 import NPUWorker

    torch.manual_seed(0)
    model = TinyModel()
    from torchair._graph_mode import graphs_compiled

    runner = runner_cls.__new__(runner_cls)  # the class's graph builder; the state a runner has at capture time
    runner.__dict__.update(
        graphs_before=graphs_compiled(),
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
        with torch.no_grad():  # as vLLM runs its model (a grad-mode change alone would recompile)
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


def compiled_graphs(runner: Any) -> int:
    """How many graphs the emulated TorchAir backend compiled since this runner was built."""
    from torchair._graph_mode import graphs_compiled

    return graphs_compiled() - runner.graphs_before


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
    x = torch.zeros(4, 6)
    if frozen(runner_cls):  # upstream's graphs: an error naming the parameter, never a silent read
        with pytest.raises(FrozenParameterMoved, match=r"down\.weight"), torch.no_grad():
            runner.decode(x)
    else:  # the patched builder: the weights are inputs, the graph reads the moved one
        with torch.no_grad():
            torch.testing.assert_close(runner.decode(x), runner.model(x))


def test_the_patch_changes_one_assignment_of_upstreams_method() -> None:
    """The recompiled method is upstream's source with `frozen_parameter = True` -> False and nothing else."""
    import dis
    import inspect
    import textwrap

    import vllm_ascend.worker.model_runner_v1 as mr

    from verl_patches.patches.vllm_ascend.worker.unfrozen_parameters import without_frozen_parameters
    from verl_patches.patching.source_edit import SourceEditError
    from verl_patches.rollout.graph_binding import FROZEN_ATTR

    upstream = upstream_graph_builder()
    patched = mr.NPUModelRunner._get_torchair_lazy_compiled_model
    assert getattr(patched, FROZEN_ATTR) is False and not hasattr(upstream, FROZEN_ATTR)
    assert patched.__code__.co_filename == upstream.__code__.co_filename  # upstream's file and lines
    assert patched.__code__.co_firstlineno == upstream.__code__.co_firstlineno
    source = textwrap.dedent(inspect.getsource(upstream))
    assert source.count("frozen_parameter = True") == 1
    edited: dict = {}
    exec(
        compile(source.replace("frozen_parameter = True", "frozen_parameter = False"), "<edited>", "exec"),
        dict(upstream.__globals__),
        edited,
    )

    def instructions(fn) -> list[tuple[str, object]]:
        return [(i.opname, i.argval) for i in dis.get_instructions(fn)]

    assert instructions(patched) == instructions(edited[upstream.__name__])
    assert instructions(patched) != instructions(upstream)
    # a drifted source (no such assignment) patches nothing and says what it looked for

    def drifted(self, batch_size):
        return batch_size

    with pytest.raises(SourceEditError, match="found 0 assignments"):
        without_frozen_parameters(drifted)


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
        life.init_cache_engine()  # KV re-init (its warm-up runs the graphs: captures them again if dropped)
        with torch.no_grad():
            torch.testing.assert_close(runner.decode(x), reference(state, x))
        life.free_cache_engine()
        life.offload_model_weights()
    assert runner.captures == 4  # the build, then one warm-up per step
    # upstream's frozen graphs are compiled again each step on that step's addresses; the patched builder's
    # one graph (weights as inputs) serves every step
    assert compiled_graphs(runner) == (4 if frozen(runner_cls) else 1)


def test_graphs_are_kept_when_the_weights_did_not_move(runner_cls) -> None:
    from verl_patches.rollout.graph_binding import forget_graphs_if_moved, record

    llm, runner = build_engine(runner_cls)
    record(runner)
    compiled = runner.torchair_compiled_model
    with torch.no_grad():
        runner.model.up.weight.mul_(2)  # written in place: same storage
    assert forget_graphs_if_moved(runner) == [] and runner.torchair_compiled_model is compiled
    runner.model.up.bias.data = runner.model.up.bias.data.clone()
    if frozen(runner_cls):
        assert forget_graphs_if_moved(runner) == ["up.bias"] and runner.torchair_compiled_model is None
    else:  # graphs that take the weights as inputs are never dropped
        assert forget_graphs_if_moved(runner) == [] and runner.torchair_compiled_model is compiled


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
