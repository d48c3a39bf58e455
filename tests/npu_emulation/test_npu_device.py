"""The "npu" device on a CPU host (verl_patches/npu_emulation/device): npu tensors whose memory is host memory.

Each behaviour against an independent reference: values computed on the CPU by formula (sums of products,
exp/sum, sorted lists), storages compared by address, the CUDA rules for mixed devices, the allocator's byte
counts, the RNG of the host. Collectives run on 2 ranks over an `hccl` (gloo) group. The extension is loaded
once per process; the cached build is loaded by a second process without compiling."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_patches import npu_emulation
from verl_patches.multirank import run_ranks
from verl_patches.npu_emulation.device import build

REPO = Path(__file__).resolve().parents[2]
NPU = "npu:0"  # a string: "npu" parses as a device only once torch_npu named the backend


def fresh_interpreter(probe: str) -> dict:
    """Run `probe` (Python source printing one JSON line last) in a new interpreter; its JSON."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def storage_address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


# ---- factories, copies, views --------------------------------------------------------------------------------
def test_factories_make_npu_tensors_with_the_values_asked_for(torch_npu):
    made = {
        "empty": torch.empty(2, 3, device="npu"),
        "zeros": torch.zeros(2, 3, device="npu:0"),
        "ones": torch.ones(4, dtype=torch.int64, device=NPU),
        "full": torch.full((2, 2), 7.5, device="npu"),
        "arange": torch.arange(1, 10, 2, device="npu"),
        "randn": torch.randn(3, device="npu"),
        "empty_like": torch.empty_like(torch.zeros(5, device="npu")),
    }
    for name, t in made.items():
        assert str(t.device) == NPU and t.device.type == "npu" and t.is_npu, name
    assert made["zeros"].cpu().tolist() == [[0.0] * 3] * 2
    assert made["ones"].cpu().tolist() == [1, 1, 1, 1] and made["ones"].dtype == torch.int64
    assert made["full"].cpu().tolist() == [[7.5, 7.5], [7.5, 7.5]]
    assert made["arange"].cpu().tolist() == [1, 3, 5, 7, 9]
    assert made["empty"].shape == (2, 3) and made["empty_like"].shape == (5,)
    assert not torch.npu.is_available()  # device probes (verl, accelerate, Megatron) keep choosing the CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_round_trips_keep_values_strides_and_dtypes(torch_npu, dtype):
    host = (torch.arange(24).reshape(4, 6) % 5).to(dtype)
    for src in (host, host.t(), host[::2, 1::2], host.t()[1:, ::3]):  # contiguous and not
        dev = src.to("npu")
        # preserve_format, as for any device: dense layouts keep their strides, gapped ones become contiguous
        assert str(dev.device) == NPU and dev.dtype == dtype and dev.stride() == torch.empty_like(src).stride()
        back = dev.cpu()
        assert back.device.type == "cpu" and torch.equal(back, src)
    as_double = host.to("npu", dtype=torch.float64)  # dtype change on the way in, on device, on the way out
    assert torch.equal(as_double.cpu(), host.double())
    assert torch.equal(as_double.to(torch.int32).cpu(), host.double().int())
    assert torch.equal(as_double.to("cpu", torch.float16), host.half())


def test_views_share_the_npu_storage_and_in_place_ops_write_through_them(torch_npu):
    make = {
        "transpose": lambda b: b.t(),
        "slice": lambda b: b[1:3, ::2],
        "select": lambda b: b[2],
        "expand": lambda b: b[:1].expand(3, 6),
        "narrow": lambda b: b.narrow(1, 2, 3),
        "unsqueeze": lambda b: b.unsqueeze(0),
        "reshape": lambda b: b.reshape(6, 4),
        "view": lambda b: b.view(-1),
        "unfold": lambda b: b.unfold(1, 2, 2),
        "view_dtype": lambda b: b.view(torch.int32),
    }
    host = torch.arange(24.0).reshape(4, 6).clone()  # a base, not a view of the arange
    base = host.to("npu")
    views = {name: f(base) for name, f in make.items()}
    for name, v in views.items():
        same_on_cpu = make[name](host)
        assert str(v.device) == NPU and storage_address(v) == storage_address(base), name
        assert v.shape == same_on_cpu.shape and v.stride() == same_on_cpu.stride(), name
        assert v.storage_offset() == same_on_cpu.storage_offset() and torch.equal(v.cpu(), same_on_cpu), name
        assert (v._base is base) == (same_on_cpu._base is host), name  # autograd sees the same views
    expected = torch.arange(24.0).reshape(4, 6)
    base.t()[2].mul_(10)  # column 2, through a transposed view
    expected[:, 2] *= 10
    base[1:3, ::2].add_(1)
    expected[1:3, ::2] += 1
    views["select"].fill_(-1)
    expected[2] = -1
    assert torch.equal(base.cpu(), expected)
    assert torch.equal(views["narrow"].cpu(), expected.narrow(1, 2, 3))


def test_out_argument_is_resized_and_keeps_its_strides(torch_npu):
    a = torch.arange(12.0).reshape(3, 4).to("npu")
    out = torch.empty(0, device="npu")
    address = out.data_ptr()
    result = torch.add(a, 1, out=out)
    assert result is out and out.shape == (3, 4) and str(out.device) == NPU and out.data_ptr() != address
    assert torch.equal(out.cpu(), torch.arange(12.0).reshape(3, 4) + 1)
    strided = torch.empty(4, 3, device="npu").t()  # right shape, column-major: written in place
    address = strided.data_ptr()
    torch.mul(a, 2, out=strided)
    assert strided.stride() == (1, 3) and strided.data_ptr() == address
    assert torch.equal(strided.cpu(), torch.arange(12.0).reshape(3, 4) * 2)
    grown = torch.arange(3.0, device="npu")
    grown.resize_(6)  # the storage grows in place and keeps what it held
    assert grown.shape == (6,) and grown[:3].cpu().tolist() == [0.0, 1.0, 2.0]
    total = torch.empty(0, dtype=torch.int64, device="npu")
    torch.sum(torch.ones(5, dtype=torch.int64, device="npu"), dim=0, out=total)
    assert total.item() == 5 and total.shape == ()


def test_item_and_compute_ops_match_their_formulas(torch_npu):
    a64 = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    b64 = torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    a, b = a64.to("npu"), b64.to("npu")
    assert torch.allclose((a @ b).cpu(), (a64.unsqueeze(-1) * b64.unsqueeze(0)).sum(1))
    assert torch.allclose(a.softmax(-1).cpu(), a64.exp() / a64.exp().sum(-1, keepdim=True))
    row = a64[0].tolist()
    top = torch.topk(a[0], 2)
    assert str(top.values.device) == NPU and top.values.cpu().tolist() == sorted(row, reverse=True)[:2]
    assert top.indices.cpu().tolist() == sorted(range(5), key=lambda i: -row[i])[:2]
    assert torch.sort(a[0]).values.cpu().tolist() == sorted(row)
    assert torch.allclose(a[0].cumsum(0).cpu(), torch.tensor(list(itertools.accumulate(row)), dtype=torch.float64))
    assert a.sum().item() == pytest.approx(sum(a64.flatten().tolist()))
    assert torch.tensor(7, device="npu").item() == 7 and torch.tensor(True, device="npu").item() is True
    assert torch.nonzero(torch.tensor([0, 3, 0, 5], device="npu")).cpu().flatten().tolist() == [1, 3]


def test_indexing_ops_match_their_formulas(torch_npu):
    src = torch.arange(12.0).reshape(3, 4)
    dev = src.to("npu")
    rows = torch.tensor([2, 0], device="npu")
    assert dev[rows].cpu().tolist() == [src[2].tolist(), src[0].tolist()]
    put = torch.zeros(5, device="npu").index_put_(
        (torch.tensor([1, 3], device="npu"),), torch.tensor([7.0, 8.0], device="npu")
    )
    assert put.cpu().tolist() == [0.0, 7.0, 0.0, 8.0, 0.0]
    idx = torch.tensor([[0, 1, 2], [2, 0, 1]])
    gathered = torch.gather(dev[:2, :3], 1, idx.to("npu")).cpu().tolist()
    assert gathered == [[src[i][idx[i][j]].item() for j in range(3)] for i in range(2)]
    scattered = torch.zeros(2, 3, device="npu").scatter_(1, idx.to("npu"), dev[:2, :3]).cpu()
    for i, j in itertools.product(range(2), range(3)):
        assert scattered[i, idx[i, j]] == src[i, j]
    mask = src > 6
    filled = dev.masked_fill(mask.to("npu"), -1.0).cpu()
    assert filled.tolist() == [[-1.0 if v > 6 else v for v in r] for r in src.tolist()]


def test_mixed_devices_are_refused_as_a_device_would_except_cpu_scalars_and_cpu_indices(torch_npu):
    dev = torch.arange(6.0).reshape(2, 3).to("npu")
    same_device = "Expected all tensors to be on the same device"
    with pytest.raises(RuntimeError, match=same_device):
        dev + torch.ones(2, 3)
    with pytest.raises(RuntimeError, match=f"{same_device}.*'mat2' of op aten::mm"):
        torch.mm(dev, torch.ones(3, 2))
    with pytest.raises(RuntimeError, match=f"{same_device}.*'mask' of op aten::masked_fill_"):
        dev.clone().masked_fill_(torch.tensor([[True, False, True]] * 2), 0.0)
    with pytest.raises(RuntimeError, match=f"{same_device}.*'values' of op aten::_index_put_impl_"):
        dev.clone().index_put_((torch.tensor([0]),), torch.ones(1, 3))  # values must be on the device
    # allowed, as on CUDA: a 0-dim CPU tensor, CPU index tensors for indexing
    assert str((dev + torch.tensor(1.0)).device) == NPU
    assert dev[torch.tensor([1])].cpu().tolist() == [[3.0, 4.0, 5.0]]
    t = dev.clone()
    t[torch.tensor([0])] = torch.full((1, 3), 9.0, device="npu")
    t.index_put_((torch.tensor([1]), torch.tensor([2])), torch.tensor(-5.0))
    assert t.cpu().tolist() == [[9.0, 9.0, 9.0], [3.0, 4.0, -5.0]]


# ---- parameters, autograd, compile ---------------------------------------------------------------------------
def test_parameter_storage_is_stable_across_in_place_updates_and_moves_on_reassignment(torch_npu):
    """What torchair's frozen_parameter relies on: in-place updates keep a parameter's address, `p.data = t`
    gives it another one (the lifecycle defect the torchair emulation catches)."""
    p = torch.nn.Parameter(torch.zeros(4, device="npu"))
    address = p.data_ptr()
    p.data.copy_(torch.arange(4.0))
    with torch.no_grad():
        p.add_(1)
    assert p.data_ptr() == address and p.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    p.data = torch.ones(4, device="npu")
    assert p.data_ptr() != address and str(p.device) == NPU
    p.data = p.data.cpu()  # offload, as CUDA allows between cuda and cpu
    assert p.device.type == "cpu" and p.tolist() == [1.0] * 4
    layer = torch.nn.Linear(3, 2).npu()
    assert str(layer.weight.device) == NPU and layer(torch.ones(1, 3, device="npu")).shape == (1, 2)


def test_backward_runs_on_npu_tensors(torch_npu):
    """In a fresh interpreter that loads the emulation first, as every job process does (the prelude):
    torch's autograd engine sizes its device queues at the process's first backward, so a process that ran
    a backward before the npu device existed (as this suite's process may have) cannot run one on it."""
    probe = (
        "import json, torch\n"
        "from verl_patches import npu_emulation\n"
        "assert npu_emulation.install_on_cpu_host()\n"
        "import torch_npu\n"
        "x64 = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))\n"
        "x = x64.to('npu').requires_grad_()\n"
        "(x.sin() * x).sum().backward()\n"
        "ok = torch.allclose(x.grad.cpu(), x64.cos() * x64 + x64.sin())\n"
        "print(json.dumps({'device': str(x.grad.device), 'ok': bool(ok)}))\n"
    )
    assert fresh_interpreter(probe) == {"device": NPU, "ok": True}


def test_compile_fullgraph_traces_fake_tensors_of_device_npu(torch_npu):
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a @ b.t()).softmax(-1) + a.sum()

    traced_devices: list[str] = []

    def recording_backend(gm, example_inputs):
        traced_devices.extend(str(n.meta["example_value"].device) for n in gm.graph.nodes if n.op == "placeholder")
        assert all(
            type(n.meta["example_value"]).__name__ == "FakeTensor" for n in gm.graph.nodes if n.op == "placeholder"
        )
        return gm.forward

    a = torch.randn(3, 4, generator=torch.Generator().manual_seed(4)).to("npu")
    b = torch.randn(5, 4, generator=torch.Generator().manual_seed(5)).to("npu")
    eager = fn(a, b)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")(a, b)
    assert str(compiled.device) == NPU and torch.equal(compiled.cpu(), eager.cpu())
    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=recording_backend)(a, b)
    assert traced_devices == ["npu:0", "npu:0"]
    torch._dynamo.reset()


# ---- RNG, memory, devices --------------------------------------------------------------------------------------
def test_random_ops_draw_from_the_host_rng(torch_npu):
    torch.manual_seed(0)
    first = torch.randn(4, device="npu")
    torch.manual_seed(0)
    again = torch.randn(4, device="npu")
    torch.manual_seed(0)
    host = torch.randn(4)
    assert str(first.device) == NPU and torch.equal(first.cpu(), again.cpu()) and torch.equal(first.cpu(), host)
    torch.npu.manual_seed(5)  # torch.npu's RNG is the host's
    a = torch.rand(3, device="npu")
    torch.manual_seed(5)
    assert torch.equal(a.cpu(), torch.rand(3))
    with torch.random.fork_rng(device_type="npu"):
        inside = torch.rand(3, device="npu")
    assert torch.equal(torch.rand(3, device="npu").cpu(), inside.cpu())  # fork_rng restored the state
    gen = torch.Generator(device="npu").manual_seed(3)
    ref = torch.Generator().manual_seed(3)
    assert str(gen.device) == NPU
    for _ in range(2):  # the generator's state advances as the host generator's would
        assert torch.equal(torch.randn(4, generator=gen, device="npu").cpu(), torch.randn(4, generator=ref))


def test_memory_counters_follow_allocation_and_free(torch_npu):
    before = torch.npu.memory_allocated()
    t = torch.empty(1024, dtype=torch.float32, device="npu")
    assert torch.npu.memory_allocated() == before + 4096
    assert torch.npu.memory_stats()["allocated_bytes.all.current"] == before + 4096
    assert torch.npu.max_memory_allocated() >= before + 4096
    t.untyped_storage().resize_(0)  # how verl and Megatron free a buffer they keep the tensor of
    assert torch.npu.memory_allocated() == before and t.untyped_storage().nbytes() == 0
    u = torch.ones(256, device="npu")
    del u
    assert torch.npu.memory_allocated() == before
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == before
    assert torch.npu.mem_get_info()[1] > 0  # totals stay the host's


def test_device_index_follows_set_device_and_guards(torch_npu, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(torch_npu.npu, "_current", torch_npu.npu._current)  # put back after the test
    try:
        torch.npu.set_device(1)
        assert torch.npu.current_device() == 1 and torch.empty(2, device="npu").device == torch.device("npu:1")
        on_0 = torch.ones(2, device="npu:0")
        assert str(on_0.device) == NPU and torch.npu.current_device() == 1  # the factory's guard put it back
        moved = on_0.to("npu:1")
        assert moved.device.index == 1 and moved.cpu().tolist() == [1.0, 1.0]
        with pytest.raises(RuntimeError, match="npu:0 and npu:1"):
            on_0 + moved
        with pytest.raises(RuntimeError, match="Invalid device ID 5"):
            torch.empty(1, device="npu:5")
    finally:
        torch.npu.set_device(0)


def test_one_stream_per_device_and_events_that_record_nothing(torch_npu):
    stream = torch.Stream(device="npu")
    assert str(stream.device) == NPU and stream.stream_id == 0  # "npu": the current device's
    assert torch.Stream(device="npu").stream_id == stream.stream_id  # a "new" stream is the one stream
    t = torch.ones(2, device="npu")
    t.record_stream(stream)  # nothing to record with one stream
    event = torch.Event(device="npu", enable_timing=True)
    event.record(stream)
    assert event.query() and stream.query()
    event.synchronize()
    with pytest.raises(RuntimeError, match="events record no time"):
        event.elapsed_time(event)


def test_cpu_and_npu_aliases_share_memory(torch_npu):
    ext = build.loaded_extension()
    dev = torch.arange(6.0).reshape(2, 3).to("npu").t()
    host = ext.cpu_alias(dev)
    assert host.device.type == "cpu" and host.stride() == dev.stride() and host.data_ptr() == dev.data_ptr()
    host.mul_(2)
    assert dev.cpu().tolist() == [[0.0, 6.0], [2.0, 8.0], [4.0, 10.0]]
    back = ext.npu_alias(host)
    assert back.device.type == "npu" and back.data_ptr() == host.data_ptr()


def test_saved_npu_tensors_load_on_the_cpu(torch_npu):
    buf = io.BytesIO()
    torch.save({"w": torch.arange(3.0, device="npu")}, buf)
    buf.seek(0)
    assert torch.load(buf, map_location="cpu", weights_only=True)["w"].tolist() == [0.0, 1.0, 2.0]


# ---- collectives on 2 ranks ------------------------------------------------------------------------------------
def _npu_rank_setup(rank: int, world: int) -> None:
    npu_emulation.install_on_cpu_host()
    import torch_npu  # noqa: F401  (registers the npu device and the hccl backend)

    torch.npu.set_device(rank)


def _collectives_on_npu(rank: int, world: int) -> dict:
    import torch.distributed as dist

    group = dist.group.WORLD
    out: dict = {"backend": dist.get_backend(), "npu_backend": type(group._get_backend(torch.device("npu"))).__name__}
    t = torch.arange(4.0, device="npu") * (rank + 1)
    dist.all_reduce(t)
    out["device"], out["all_reduce"] = str(t.device), t.cpu().tolist()
    gathered = torch.empty(2 * 3, device="npu")
    dist.all_gather_into_tensor(gathered, torch.full((3,), float(rank), device="npu"))
    out["all_gather"] = gathered.cpu().tolist()
    part = torch.empty(2, device="npu")
    dist.reduce_scatter_tensor(part, torch.arange(4.0, device="npu") + rank)
    out["reduce_scatter"] = part.cpu().tolist()
    send = [1, 2] if rank == 0 else [3, 1]  # uneven: what this rank sends to rank 0, rank 1
    recv = [1, 3] if rank == 0 else [2, 1]
    received = torch.empty(sum(recv), device="npu")
    dist.all_to_all_single(received, torch.arange(float(sum(send)), device="npu") + 10 * rank, recv, send)
    out["all_to_all"] = received.cpu().tolist()
    b = torch.full((2,), float(rank), device="npu")
    dist.broadcast(b, src=1)
    out["broadcast"] = b.cpu().tolist()
    ins = [torch.full((rank + 1 + peer, 2), float(10 * rank + peer), device="npu") for peer in range(world)]
    outs = [torch.empty((peer + 1 + rank, 2), device="npu") for peer in range(world)]
    dist.all_to_all(outs, ins)  # HCCL has the list form, gloo has not
    out["all_to_all_list"] = [o.cpu().tolist() for o in outs]
    gloo = dist.new_group(backend="gloo")
    g = torch.full((2,), float(rank + 1), device="npu")
    dist.all_reduce(g, group=gloo, async_op=True).wait()
    out["gloo_all_reduce"] = g.cpu().tolist()
    with torch.inference_mode():  # as vllm-ascend's TP MoE gathers into views of its hidden states (fused_moe.py)
        hidden = torch.zeros(4, 2, device="npu")
        dist.all_gather(list(torch.tensor_split(hidden, 2)), torch.full((2, 2), float(rank + 1), device="npu"))
    out["inference_all_gather"] = hidden.cpu().tolist()
    with torch.inference_mode():  # a prefill's odd token count: chunks of 2 and 1 rows, as HCCL gathers them
        hidden = torch.zeros(3, 2, device="npu")
        chunks = torch.tensor_split(hidden, 2)
        dist.all_gather(list(chunks), torch.full(tuple(chunks[rank].shape), float(rank + 1), device="npu"))
    out["uneven_all_gather"] = hidden.cpu().tolist()
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_collectives_on_npu_tensors_over_hccl_and_gloo_groups(torch_npu):
    two_devices = {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    out = run_ranks(
        _collectives_on_npu, 2, 120, backend="hccl", setup=_npu_rank_setup, rank_env=[two_devices, two_devices]
    )
    inputs = {r: torch.arange(4.0) + r for r in range(2)}  # reduce_scatter's inputs, summed then split
    for rank, res in enumerate(out):
        assert res["backend"] == "hccl" and res["npu_backend"] == "ProcessGroupGloo"
        assert res["device"] == f"npu:{rank}"
        assert res["all_reduce"] == (torch.arange(4.0) * 1 + torch.arange(4.0) * 2).tolist()
        assert res["all_gather"] == [0.0] * 3 + [1.0] * 3
        assert res["reduce_scatter"] == (inputs[0] + inputs[1])[2 * rank : 2 * rank + 2].tolist()
        assert res["broadcast"] == [1.0, 1.0]
        assert res["gloo_all_reduce"] == [3.0, 3.0]
        assert res["inference_all_gather"] == [[1.0, 1.0]] * 2 + [[2.0, 2.0]] * 2
        assert res["uneven_all_gather"] == [[1.0, 1.0]] * 2 + [[2.0, 2.0]]
        # rank r sends peer p a (r + 1 + p, 2) block of 10 r + p
        assert res["all_to_all_list"] == [[[10.0 * p + rank] * 2] * (p + 1 + rank) for p in range(2)]
    # all_to_all_single with uneven splits: rank 0 sends [0] | [1, 2], rank 1 sends [10, 11, 12] | [13]
    assert out[0]["all_to_all"] == [0.0, 10.0, 11.0, 12.0]
    assert out[1]["all_to_all"] == [1.0, 2.0, 13.0]


# ---- the build ---------------------------------------------------------------------------------------------------
def test_a_second_process_loads_the_cached_build_without_compiling(torch_npu):
    probe = (
        "import io, json, time\n"
        "import torch\n"
        "from verl_patches.npu_emulation.device import build\n"
        "log = io.StringIO(); start = time.monotonic(); ext = build.load_extension(log=log)\n"
        "print(json.dumps({'s': time.monotonic() - start, 'log': log.getvalue(), 'file': ext.__file__}))\n"
    )
    res = fresh_interpreter(probe)
    assert res["log"] == "" and Path(res["file"]) == build.library_path(build.build_dir())
    assert res["s"] < 10, res
    assert build.load_extension() is build.loaded_extension()  # this process: loaded once


def test_the_build_folder_is_in_the_user_cache_keyed_by_torch_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = build.build_dir()
    assert folder.parent == tmp_path / "verl_patches" / "torch_extensions"
    assert folder.name.startswith(f"{torch.__version__}-") and not folder.is_relative_to(REPO)
    monkeypatch.setattr(build, "CFLAGS", ("-O0",))
    assert build.build_dir() != folder  # other flags, another build


def _fake_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, library: bytes = b"the library") -> tuple[Path, list]:
    """A build folder under a private cache root in tmp_path, with the compiler replaced by one that writes
    ``library`` and the import by a marker: the cache's checks run for real, no compiler does."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(root))
    compiled: list[Path] = []

    def fake_compile(where: Path, source: Path):
        assert not (where / build.TORCH_BATON).exists()  # torch would have waited on it forever
        assert source.parent == where and source.read_bytes() == build.SOURCE.read_bytes()  # the text hashed
        compiled.append(where)
        build.library_path(where).write_bytes(library)
        return "the module"

    monkeypatch.setattr(build, "_compile", fake_compile)
    monkeypatch.setattr(build, "_import", lambda where: "imported")
    monkeypatch.setattr(build, "_module", None)
    return build.build_dir(), compiled


def _load_refused(monkeypatch: pytest.MonkeyPatch, match: str) -> str:
    monkeypatch.setattr(build, "_module", None)  # a new process
    with pytest.raises(build.ExtensionCacheError, match=match) as err:
        build.load_extension(log=io.StringIO())
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_build_clears_a_stale_torch_lock_compiles_once_and_records_the_digests(monkeypatch, tmp_path):
    folder, compiled = _fake_build(monkeypatch, tmp_path)
    folder.mkdir(parents=True, mode=0o700)
    (folder / build.TORCH_BATON).write_text("")  # left by a builder that was killed
    log = io.StringIO()
    assert build.load_extension(log=log) == "the module" and compiled == [folder]
    assert "compiling the npu device emulation" in log.getvalue() and build.is_built(folder)
    record = json.loads((folder / build.BUILT_MARK).read_text())
    assert record["torch"] == torch.__version__
    assert record["library_sha256"] == hashlib.sha256(b"the library").hexdigest()
    assert record["source_sha256"] == hashlib.sha256(build.SOURCE.read_bytes()).hexdigest()
    monkeypatch.setattr(build, "_module", None)  # a new process: finds the finished build
    log = io.StringIO()
    assert build.load_extension(log=log) == "imported" and compiled == [folder] and log.getvalue() == ""


def test_the_cache_folders_are_created_private_and_the_build_seals_what_it_wrote(monkeypatch, tmp_path):
    folder, _ = _fake_build(monkeypatch, tmp_path)
    saved = os.umask(0)  # a umask that would leave everything open
    try:
        assert build.load_extension(log=io.StringIO()) == "the module"
    finally:
        os.umask(saved)
    root = tmp_path / "cache"
    for level in (root / "verl_patches", root / "verl_patches" / "torch_extensions", folder):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
    for name in (build.BUILT_MARK, build.library_path(folder).name):
        assert not (folder / name).stat().st_mode & 0o022, name
    monkeypatch.setattr(build, "_module", None)
    assert build.load_extension(log=io.StringIO()) == "imported"


def test_a_library_changed_after_its_build_is_refused_by_name_and_never_loaded(monkeypatch, tmp_path):
    folder, compiled = _fake_build(monkeypatch, tmp_path)
    build.load_extension(log=io.StringIO())
    build.library_path(folder).write_bytes(b"planted code")
    message = _load_refused(monkeypatch, "sha256 .* is not the .* recorded in built.json")
    assert str(build.library_path(folder)) in message and f"remove {folder}" in message
    assert compiled == [folder]  # not rebuilt over a library a process may have mapped


@pytest.mark.parametrize(
    "record, match",
    [
        (b"{not json", "Expecting property name"),
        (b"[]", "not a JSON object"),
        (json.dumps({"source_sha256": "0" * 64}).encode(), "key 'library_sha256' must be a sha256"),
        (b"\xff", "invalid start byte"),
        (b" " * (build.BUILT_MARK_MAX_BYTES + 1), "more than"),
    ],
)
def test_a_damaged_build_record_is_refused_in_one_line(monkeypatch, tmp_path, record, match):
    folder, _ = _fake_build(monkeypatch, tmp_path)
    build.load_extension(log=io.StringIO())
    (folder / build.BUILT_MARK).write_bytes(record)
    assert str(folder / build.BUILT_MARK) in _load_refused(monkeypatch, match)


def test_a_record_of_another_source_is_refused(monkeypatch, tmp_path):
    folder, _ = _fake_build(monkeypatch, tmp_path)
    build.load_extension(log=io.StringIO())
    record = json.loads((folder / build.BUILT_MARK).read_text())
    (folder / build.BUILT_MARK).write_text(json.dumps({**record, "source_sha256": "0" * 64}))
    _load_refused(monkeypatch, "built from source sha256 0{64}, not npu_device.cpp's")


@pytest.mark.parametrize("name", [build.BUILT_MARK, "verl_npu_device.so"])
def test_files_others_can_write_or_links_are_refused(monkeypatch, tmp_path, name):
    folder, _ = _fake_build(monkeypatch, tmp_path)
    build.load_extension(log=io.StringIO())
    (folder / name).chmod(0o666)
    _load_refused(monkeypatch, rf"{name}: is writable by group/others \(mode 666\); `chmod go-w ")
    moved = tmp_path / "elsewhere"
    (folder / name).rename(moved)
    (folder / name).symlink_to(moved)
    _load_refused(monkeypatch, rf"{name}: cannot be opened without following links")


@pytest.mark.parametrize("level", ["root", "verl_patches", "torch_extensions", "build"])
def test_a_cache_folder_others_can_write_is_refused_and_nothing_is_built(monkeypatch, tmp_path, level):
    folder, compiled = _fake_build(monkeypatch, tmp_path)
    folder.mkdir(parents=True, mode=0o700)
    target = {"root": tmp_path / "cache", "build": folder}.get(level) or next(
        p for p in folder.parents if p.name == level
    )
    target.chmod(0o777)
    message = _load_refused(monkeypatch, "is writable by group/others")
    assert message.startswith(f"npu device emulation: {target}: ") and f"`chmod go-w {target}`" in message
    assert "XDG_CACHE_HOME" in message and compiled == []


def test_a_cache_folder_of_another_account_is_refused_and_nothing_is_built(monkeypatch, tmp_path):
    folder, compiled = _fake_build(monkeypatch, tmp_path)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 4242)  # every folder of this test is now someone else's
    message = _load_refused(monkeypatch, f"cache: is owned by uid {real}, not by this account")
    assert "XDG_CACHE_HOME" in message and compiled == [] and not folder.exists()


def test_a_cache_level_swapped_for_a_link_is_refused_not_followed(monkeypatch, tmp_path):
    folder, compiled = _fake_build(monkeypatch, tmp_path)
    build.load_extension(log=io.StringIO())
    levels = tmp_path / "cache" / "verl_patches"
    (levels / "torch_extensions").rename(tmp_path / "theirs")
    (levels / "torch_extensions").symlink_to(tmp_path / "theirs")
    _load_refused(monkeypatch, "torch_extensions: is a symbolic link; a cache folder is never followed")
    assert compiled == [folder]


def test_the_lock_is_not_opened_through_a_link(monkeypatch, tmp_path):
    folder, compiled = _fake_build(monkeypatch, tmp_path)
    folder.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    (folder / build.FLOCK_NAME).symlink_to(victim)
    _load_refused(monkeypatch, "build.flock: cannot be opened without following links")
    assert not victim.exists() and compiled == []


def test_the_build_command_says_a_refusal_in_one_line(monkeypatch, tmp_path, capsys):
    _fake_build(monkeypatch, tmp_path)
    (tmp_path / "cache").chmod(0o775)
    assert build.main() == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is writable by group/others (mode 775)" in err
