"""Every declared patch that lands inside the model vllm-ascend compiles is traced with `fullgraph=True`.

vllm-ascend 0.9.1 compiles its DeepSeek model for TorchAir with `torch.compile(model, dynamic=True,
fullgraph=True, backend=torchair)` (`NPUModelRunner._get_torchair_lazy_compiled_model`): anything dynamo
cannot trace in that call tree (a context manager, a thread-local write, a graph break) stops `LLM(...)` on
every rank. Each patch whose target sits in the compiled call tree has a trace case here that installs it as
the registry would on the NPU and compiles the patched upstream code with `fullgraph=True` (the "eager"
backend: the trace is what is checked). NPU kernels are stand-in `torch.library` operators, kept by dynamo
as single opaque nodes like torch_npu's own registered operators.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from verl_patches.patches.catalog import all_patches

# Modules whose code runs inside the compiled forward of vllm-ascend's DeepSeek model (or is called from it).
COMPILED_REGION = (
    "vllm_ascend.attention",
    "vllm_ascend.models",
    "vllm_ascend.ops",
    "vllm_ascend.quantization",
    "vllm_ascend.distributed",
    "vllm_ascend.multistream",
    "vllm.model_executor.models",
    "vllm.model_executor.layers",
    "vllm.attention",
    "vllm.distributed",
    "vllm.forward_context",
    "torch_npu",
    "torchair",
)

CALLS: list[tuple[str, dict]] = []


@torch.library.custom_op("verl_test_npu::kv_rmsnorm_rope_cache", mutates_args=())
def _kv_rmsnorm_rope_cache(
    kv: torch.Tensor,
    gamma: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    index: torch.Tensor,
    v_cache: torch.Tensor,
    k_cache: torch.Tensor,
    epsilon: float,
    cache_mode: str,
    is_output_kv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    CALLS.append(("npu_kv_rmsnorm_rope_cache", {"cache_mode": cache_mode}))
    nope, pe = kv[..., : gamma.shape[0]], kv[..., gamma.shape[0] :]
    return pe.clone(), nope.clone(), pe.clone(), nope.clone()


@_kv_rmsnorm_rope_cache.register_fake
def _(kv, gamma, cos, sin, index, v_cache, k_cache, epsilon, cache_mode, is_output_kv=False):
    nope, pe = kv[..., : gamma.shape[0]], kv[..., gamma.shape[0] :]
    return pe.clone(), nope.clone(), pe.clone(), nope.clone()


@torch.library.custom_op("verl_test_npu::reshape_and_cache", mutates_args=("key_cache",))
def _reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_indices: torch.Tensor,
) -> None:
    CALLS.append(("_npu_reshape_and_cache", {}))


@_reshape_and_cache.register_fake
def _(key, value, key_cache, value_cache, slot_indices):
    return None


@torch.library.custom_op("verl_test_npu::passthrough", mutates_args=())
def _passthrough(x: torch.Tensor) -> torch.Tensor:
    CALLS.append(("passthrough", {}))
    return x * 2


@_passthrough.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.fixture()
def mla_v1(monkeypatch):
    """vllm-ascend's mla_v1 whose torch_npu has the stand-in kernels; CALLS records what reaches them."""
    import vllm_ascend.attention.mla_v1 as mla

    real = mla.torch_npu
    monkeypatch.setattr(real, "npu_kv_rmsnorm_rope_cache", _kv_rmsnorm_rope_cache, raising=False)
    monkeypatch.setattr(real, "_npu_reshape_and_cache", _reshape_and_cache, raising=False)
    monkeypatch.setattr(real, "npu_verl_test_passthrough", _passthrough, raising=False)
    CALLS.clear()
    torch._dynamo.reset()
    return mla


def install_compiled_region_patches(monkeypatch) -> None:
    """What the registry does on the NPU (the F4 flag on): every patch of the compiled region, in catalog
    order, so each trace runs under the whole stack of patches the model would carry."""
    import importlib

    from verl_patches.patching.declaration import Kind

    for patch in all_patches():
        if not in_compiled_region(patch):
            continue
        owner = importlib.import_module(patch.module)
        *owners, attr = patch.qualname.split(".")
        for name in owners:
            owner = getattr(owner, name)
        new = patch.replacement(getattr(owner, attr)) if patch.kind is Kind.WRAP else patch.replacement()
        monkeypatch.setattr(owner, attr, new)


def mla_impl(enable_kv_nz: bool = True) -> SimpleNamespace:
    proj = torch.nn.Linear(8, 6)
    return SimpleNamespace(
        num_kv_heads=1,
        kv_lora_rank=4,
        qk_rope_head_dim=2,
        enable_kv_nz=enable_kv_nz,
        torchair_graph_enabled=True,
        kv_a_proj_with_mqa=lambda h: (proj(h),),
        kv_a_layernorm=SimpleNamespace(weight=torch.ones(4), variance_epsilon=1e-6),
    )


def compiled(fn: Callable) -> Callable:
    return torch.compile(fn, dynamic=True, fullgraph=True, backend="eager")


def trace_f4_torch_npu(mla, monkeypatch) -> None:
    """F4's mla_v1.torch_npu: the real exec_kv_prefill (PA_BLK_NZ -> PA_NZ), the graph-mode ND re-write
    through the module global as forward calls it (dropped), a kernel F4 does not touch (passed through),
    and the real forward's entry, all compiled with fullgraph=True."""
    impl = mla_impl()
    cache = (torch.zeros(4, 1, 4), torch.zeros(4, 1, 2))

    def prefill(h, cos, sin, slots):
        return mla.AscendMLAImpl.exec_kv_prefill(impl, h, cos, sin, cache, slots)

    def graph_mode_cache_writes(k, v):
        mla.torch_npu._npu_reshape_and_cache(
            key=k, value=v, key_cache=cache[0], value_cache=cache[1], slot_indices=torch.arange(k.shape[0])
        )
        return mla.torch_npu.npu_verl_test_passthrough(k)

    def forward_entry(q, kv, pe):
        out = torch.zeros_like(q)
        return mla.AscendMLAImpl.forward(impl, None, q, kv, pe, cache, None, output=out)

    pe, nope = compiled(prefill)(torch.randn(3, 8), torch.zeros(1), torch.zeros(1), torch.arange(3))
    assert nope.shape == (3, 1, 1, 4) and pe.shape == (3, 1, 1, 2)
    torch.testing.assert_close(
        compiled(graph_mode_cache_writes)(torch.ones(2, 1, 4), torch.ones(2, 1, 2)), torch.full((2, 1, 4), 2.0)
    )
    assert compiled(forward_entry)(torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 2)).shape == (2, 4)
    assert CALLS == [("npu_kv_rmsnorm_rope_cache", {"cache_mode": "PA_NZ"}), ("passthrough", {})]


def trace_grouped_topk(_mla, _monkeypatch) -> None:
    """The router wrap: select_experts' grouped branch (DeepSeek's rule, biased and unbiased) and a branch it
    leaves to upstream, compiled with fullgraph=True, choosing what the eager call chooses."""
    import vllm_ascend.ops.fused_moe as fused_moe

    torch.manual_seed(0)
    hidden, logits, bias = torch.randn(5, 8), torch.randn(5, 16), torch.randn(16) * 0.1
    for kwargs in (
        dict(
            use_grouped_topk=True,
            topk_group=2,
            num_expert_group=4,
            scoring_func="sigmoid",
            e_score_correction_bias=bias,
        ),
        dict(use_grouped_topk=True, topk_group=2, num_expert_group=4, scoring_func="softmax"),
        dict(use_grouped_topk=False),
    ):

        def route(h, r, kwargs=kwargs):
            return fused_moe.select_experts(h, r, 4, renormalize=True, **kwargs)

        (w_eager, ids_eager), (w_graph, ids_graph) = route(hidden, logits), compiled(route)(hidden, logits)
        assert torch.equal(ids_graph, ids_eager), kwargs
        torch.testing.assert_close(w_graph, w_eager)


TRACE_CASES: dict[str, Callable] = {
    "vllm_ascend.mla_v1.kv_nz.torch_npu": trace_f4_torch_npu,
    "vllm_ascend.fused_moe.grouped_topk_as_deepseek": trace_grouped_topk,
}


# Modules under those that never run in a forward: vLLM's model registry resolves the model class at engine build.
OUTSIDE_FORWARD = ("vllm.model_executor.models.registry",)


def in_compiled_region(patch) -> bool:
    def under(prefixes: tuple[str, ...]) -> bool:
        return any(patch.module == m or patch.module.startswith(m + ".") for m in prefixes)

    return under(COMPILED_REGION) and not under(OUTSIDE_FORWARD)


def test_every_patch_in_the_compiled_region_has_a_fullgraph_trace() -> None:
    inside = sorted(p.name for p in all_patches() if in_compiled_region(p))
    assert inside, "no declared patch lands in the compiled region: COMPILED_REGION is out of date"
    assert sorted(TRACE_CASES) == inside, "each patch inside the compiled model needs a fullgraph trace case here"


@pytest.mark.parametrize("name", sorted(TRACE_CASES))
def test_patch_traces_with_fullgraph(name, mla_v1, monkeypatch) -> None:
    install_compiled_region_patches(monkeypatch)
    TRACE_CASES[name](mla_v1, monkeypatch)
