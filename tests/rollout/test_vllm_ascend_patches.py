"""F4 (KV-NZ) and the DP metadata sync over the device group, checked on CPU by running vllm-ascend's own
method bodies at the pin (compiled from the vendored file) against recording fakes of the NPU kernels and
of torch.distributed. The kernels themselves are NPU-only: nothing here checks them numerically."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch

from verl_patches.patches.vllm_ascend import declarations
from verl_patches.patches.vllm_ascend.attention import kv_nz
from verl_patches.patches.vllm_ascend.worker import dp_sync
from verl_patches.patching.fingerprint import fingerprint_target

REPO = Path(__file__).resolve().parents[2]
MLA = REPO / "vllm_ascend" / "attention" / "mla_v1.py"
RUNNER = REPO / "vllm_ascend" / "worker" / "model_runner_v1.py"


def upstream_method(path: Path, cls: str, name: str, namespace: dict[str, Any]):
    """The method exactly as the pinned file defines it, compiled against `namespace` as its globals."""
    tree = ast.parse(path.read_text())
    node = next(
        n
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for n in c.body
        if isinstance(n, ast.FunctionDef) and n.name == name
    )
    source = textwrap.dedent(ast.get_source_segment(path.read_text(), node))
    exec(compile(source, str(path), "exec"), namespace)  # noqa: S102  (upstream code at the pin)
    return namespace[name]


class RecordingNpu:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def npu_kv_rmsnorm_rope_cache(self, *args, **kwargs):
        self.calls.append(("npu_kv_rmsnorm_rope_cache", kwargs))
        return None, None, torch.zeros(1), torch.zeros(1)

    def _npu_reshape_and_cache(self, **kwargs):
        self.calls.append(("_npu_reshape_and_cache", kwargs))


def mla_self(enable_kv_nz: bool) -> SimpleNamespace:
    w = torch.randn(8, 6)
    return SimpleNamespace(
        num_kv_heads=1,
        kv_lora_rank=4,
        qk_rope_head_dim=2,
        enable_kv_nz=enable_kv_nz,
        kv_a_proj_with_mqa=lambda h: (h @ w,),
        kv_a_layernorm=SimpleNamespace(weight=torch.ones(4), variance_epsilon=1e-6),
    )


@pytest.mark.parametrize("nz, want_upstream, want_patched", [(True, "PA_BLK_NZ", "PA_NZ"), (False, "PA", "PA")])
def test_exec_kv_prefill_writes_the_nz_cache_with_pa_nz(nz: bool, want_upstream: str, want_patched: str) -> None:
    fake = RecordingNpu()
    args = (torch.randn(3, 8), torch.zeros(1), torch.zeros(1), (torch.zeros(1), torch.zeros(1)), torch.arange(3))
    upstream = upstream_method(
        MLA, "AscendMLAImpl", "exec_kv_prefill", {"torch": torch, "torch_npu": fake, "Tuple": tuple}
    )
    upstream(mla_self(nz), *args)
    patched = upstream_method(
        MLA,
        "AscendMLAImpl",
        "exec_kv_prefill",
        {"torch": torch, "torch_npu": kv_nz.proxied_torch_npu(fake), "Tuple": tuple},
    )
    patched(mla_self(nz), *args)
    assert [c[1]["cache_mode"] for c in fake.calls] == [want_upstream, want_patched]


def test_the_proxy_drops_the_nd_rewrite_and_passes_every_other_kernel_through() -> None:
    fake = RecordingNpu()
    proxy = kv_nz.proxied_torch_npu(fake)
    assert kv_nz.proxied_torch_npu(proxy) is proxy  # applying twice is a no-op
    assert proxy._npu_reshape_and_cache(key=1) is None and fake.calls == []
    proxy.npu_kv_rmsnorm_rope_cache(cache_mode="PA")
    assert fake.calls == [("npu_kv_rmsnorm_rope_cache", {"cache_mode": "PA"})]
    assert proxy.calls is fake.calls  # any other name is the real module's, read at call time
    fake.late = "added after the patch"
    assert proxy.late == "added after the patch"


def _mla_tree() -> ast.Module:
    return ast.parse(MLA.read_text())


def _method(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(
        n
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "AscendMLAImpl"
        for n in c.body
        if isinstance(n, ast.FunctionDef) and n.name == name
    )


def test_upstream_writes_the_cache_only_where_the_patch_expects() -> None:
    """The invariants that make F4 static (no scope marking): in mla_v1 every _npu_reshape_and_cache call
    is in AscendMLAImpl.forward, two under `if self.torchair_graph_enabled:` (dropped by F4) and one in its
    `else:` (eager, never reached in graph mode); "PA_BLK_NZ" is passed by exec_kv_prefill only."""
    tree = _mla_tree()
    fwd = _method(tree, "forward")
    branch = next(
        n
        for n in ast.walk(fwd)
        if isinstance(n, ast.If)
        and ast.unparse(n.test) == "self.torchair_graph_enabled"
        and "_npu_reshape_and_cache" in ast.unparse(n)
    )
    count = lambda nodes, text: sum(ast.unparse(x).count(text) for x in nodes)  # noqa: E731
    call = "torch_npu._npu_reshape_and_cache("
    assert count(branch.body, call) == 2 and count(branch.orelse, call) == 1
    assert count([fwd], call) == 3 == count([tree], call)
    assert count([_method(tree, "exec_kv_prefill")], "PA_BLK_NZ") == 1 == count([tree], "PA_BLK_NZ")


class RecordingDist:
    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, world: int) -> None:
        self.world, self.groups = world, []

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        self.groups.append(group)
        tensor.mul_(self.world)  # every rank contributes the same values


@pytest.mark.parametrize("with_prefill", [True, False])
def test_dp_metadata_all_reduce_goes_to_the_device_group_with_the_same_result(with_prefill, monkeypatch) -> None:
    cpu_group, device_group = object(), object()
    monkeypatch.setattr(
        "vllm.distributed.parallel_state.get_dp_group",
        lambda: SimpleNamespace(cpu_group=cpu_group, device_group=device_group),
    )
    results = {}
    for name, wrap in (("upstream", False), ("patched", True)):
        fake = RecordingDist(2)
        ns = {
            "torch": torch,
            "dist": dp_sync.proxied_dist(fake) if wrap else fake,
            "Optional": Optional,
            "get_dp_group": lambda: SimpleNamespace(cpu_group=cpu_group, device_group=device_group),
            "envs_ascend": SimpleNamespace(VLLM_ASCEND_ENABLE_CHUNK_MC2=0),
        }
        fn = upstream_method(RUNNER, "NPUModelRunner", "_get_forward_metadata_across_dp", ns)
        if wrap:
            fn = dp_sync.wrap_forward_metadata(fn)
        runner = SimpleNamespace(
            dp_size=2,
            dp_rank=1,
            is_kv_producer=False,
            is_kv_consumer=False,
            torchair_graph_enabled=False,
            device=torch.device("cpu"),
            in_profile_run=False,
        )
        out = fn(runner, 8, 5, with_prefill, False)
        results[name] = (out[0], out[1].tolist(), out[2], out[3], fake.groups)
    assert results["upstream"][:4] == results["patched"][:4]
    assert results["upstream"][4] == [cpu_group] and results["patched"][4] == [device_group]


# vllm-ascend patches that also apply on a CPU host, each for a reason of its own
ON_CPU = {
    # the engine runs there too: its graphs must take the weights as inputs on every host
    "vllm_ascend.model_runner_v1.torchair_unfrozen_parameters": ("npu", "cpu"),
    # the CPU proof's rollout EP2 decodes through MC2 as A3 does at EP 256 (A3 never needs it)
    "vllm_ascend.forward_context.mc2_decode_at_small_ep": ("cpu",),
    # a routing rule (DeepSeek-V3's, below 256 experts) and a counter of graph-decode tokens: what A3 runs, the
    # CPU proof runs too
    "vllm_ascend.fused_moe.grouped_topk_as_deepseek": ("npu", "cpu"),
    "vllm_ascend.model_runner_v1.graph_decode_counts": ("npu", "cpu"),
}


def test_declarations_are_npu_only_and_pinned() -> None:
    for p in declarations.PATCHES:
        assert p.devices == ON_CPU.get(p.name, ("npu",)), p.name
        assert fingerprint_target(*p.fingerprint_targets) == p.fingerprint, p.name
    f4 = [p for p in declarations.PATCHES if p.vendor_item == "F4"]
    assert {p.name for p in declarations.PATCHES} >= {"npu.vllm_ascend.kernels_path"}
    assert len(f4) == 1 and "NOT numerically" in f4[0].reason


def test_f4_is_installed_only_with_its_flag() -> None:
    from verl_patches.worker_calls.env_names import KV_NZ_FLAG

    (f4,) = [p for p in declarations.PATCHES if p.vendor_item == "F4"]
    assert f4.env_flag == KV_NZ_FLAG and f4.env_default is False
    assert not f4.env_flag_on({}) and not f4.env_flag_on({KV_NZ_FLAG: "0"}) and f4.env_flag_on({KV_NZ_FLAG: "1"})


def test_wrap_factories_take_the_original() -> None:
    class Dummy:
        def forward(self):
            return 1

    for p in declarations.PATCHES:
        if not p.calls_original:  # a source edit of the method it replaces: tests/rollout/test_graph_binding.py
            continue
        if p.name.endswith("kernels_path"):
            original = ["/vendored/vllm_ascend"]
        elif p.name.endswith((".dist", ".torch_npu")):
            original = SimpleNamespace(all_reduce=None, npu_kv_rmsnorm_rope_cache=None)
        else:
            original = Dummy.forward
        assert p.replacement(original) is not None
