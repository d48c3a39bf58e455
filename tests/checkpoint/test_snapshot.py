"""What a save's snapshot holds, and what it does not copy (issue 42).

A background write reads the snapshot while the next step runs, so the snapshot should copy only what it must:
weights verl offloaded to the host are views of the host buffer verl keeps them in; the optimizer state of a
data-parallel group of one rank (the experts' on A3) is kept as pieces that are the swap optimizer's host buffers
themselves, laid end to end exactly as Megatron's gather lays them, zeros where the buffer pads; device state is
copied. The loader joins the pieces back into Megatron's world tensors, and refuses pieces that do not add up.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from verl_patches.checkpoint import optimizer_state
from verl_patches.checkpoint.safe_load import CheckpointFileError
from verl_patches.train_engine import actor_state


class Range:
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end


def one_rank_group() -> SimpleNamespace:
    return SimpleNamespace(size=lambda: 1)


def fake_optimizer(host_map: dict | None, spans: list[tuple[int, int]], unpadded: int, dp_size: int = 1):
    """A distributed optimizer of one buffer and one bucket whose parameters sit at ``spans`` of the bucket."""
    model_params = [torch.nn.Parameter(torch.zeros(end - start)) for start, end in spans]
    mains = [torch.arange(start, end, dtype=torch.float32) + 0.5 for start, end in spans]
    state = {m: {"exp_avg": m * 2, "exp_avg_sq": m * 3} for m in mains}
    cls = type("SwapLike", (), {"param_to_cpu_states_map": host_map} if host_map is not None else {})
    inner = cls()
    inner.gbuf_ranges = [
        {torch.float32: [{"param_map": {p: {"gbuf_local": Range(*span)} for p, span in zip(model_params, spans)}}]}
    ]
    inner.buffers = [SimpleNamespace(numel_unpadded=unpadded, buckets=[SimpleNamespace(numel_unpadded=unpadded)])]
    inner.model_param_group_index_map = {p: (0, i) for i, p in enumerate(model_params)}
    inner.optimizer = SimpleNamespace(param_groups=[{"params": mains}], state=state)
    inner.data_parallel_group_gloo = SimpleNamespace(size=lambda: dp_size)
    inner.gathered = []
    inner.get_parameter_state_dp_zero = lambda: inner.gathered.append(True) or "megatron's gather"
    return inner, mains, state


def expected_world(spans, unpadded, value) -> torch.Tensor:
    out = torch.zeros(unpadded)
    for start, end in spans:
        out[start:end] = value(torch.arange(start, end, dtype=torch.float32) + 0.5)
    return out


SPANS = [(0, 5), (64, 70), (128, 131)]  # Megatron pads each parameter's start to 64 elements
UNPADDED = 140


def test_a_one_rank_group_is_kept_as_pieces_that_join_into_megatrons_world_tensors() -> None:
    inner, mains, state = fake_optimizer(None, SPANS, UNPADDED)
    pieces = optimizer_state._world_state(inner)
    assert inner.gathered == []  # no gather, no copy of host state
    world = pieces[0][torch.float32]
    assert world["numel_unpadded"] == UNPADDED and pieces["buckets_coalesced"] is True
    joined = optimizer_state.coalesced(pieces, "optim.pt")[0][torch.float32]
    for key, value in (("param", lambda m: m), ("exp_avg", lambda m: m * 2), ("exp_avg_sq", lambda m: m * 3)):
        assert torch.equal(joined[key], expected_world(SPANS, UNPADDED, value)), key
    # the pieces of host tensors are the tensors themselves: nothing copied
    params = [t for t in world["param"] if t.numel() in (5, 6, 3)]
    assert [t.data_ptr() for t in params] == [m.data_ptr() for m in mains]
    # every gap is a view of one zeros buffer (one storage in the file)
    gaps = [t for t in world["param"] if t.numel() not in (5, 6, 3)]
    assert len({t.untyped_storage().data_ptr() for t in gaps}) == 1


def test_the_swap_optimizers_host_buffers_are_written_as_they_are() -> None:
    host = {}
    inner, mains, _ = fake_optimizer(host, SPANS, UNPADDED)
    for m in mains:  # MindSpeed's class-level map: main param -> its state in host buffers (the device copy freed)
        host[m] = {"param": m.clone() + 100, "exp_avg": m.clone() + 200, "exp_avg_sq": m.clone() + 300}
    world = optimizer_state._world_state(inner)[0][torch.float32]
    kept = [t for t in world["exp_avg"] if t.numel() in (5, 6, 3)]
    assert [t.data_ptr() for t in kept] == [host[m]["exp_avg"].data_ptr() for m in mains]
    joined = optimizer_state.coalesced({0: {torch.float32: world}}, "f")[0][torch.float32]
    assert torch.equal(joined["param"], expected_world(SPANS, UNPADDED, lambda m: m + 100))


@pytest.mark.parametrize(
    "spans, unpadded, dp",
    [([(0, 5), (3, 8)], 20, 1), ([(0, 5)], 4, 1), ([(0, 5)], 10, 2)],
    ids=["overlapping parameters", "a parameter past the bucket", "a group of two ranks"],
)
def test_anything_else_is_left_to_megatrons_gather(spans, unpadded, dp) -> None:
    inner, _, _ = fake_optimizer(None, spans, unpadded, dp_size=dp)
    assert optimizer_state._world_state(inner) == "megatron's gather" and inner.gathered == [True]


def test_pieces_that_do_not_add_up_are_refused_naming_the_file() -> None:
    bad = {0: {torch.float32: {"param": [torch.zeros(3)], "numel_unpadded": 4}}}
    with pytest.raises(CheckpointFileError, match=r"optim\.pt: buffer 0 param: the pieces hold 3 values"):
        optimizer_state.coalesced(bad, "optim.pt")
    with pytest.raises(CheckpointFileError, match="expected a list of tensors"):
        optimizer_state.coalesced({0: {torch.float32: {"param": ["x"], "numel_unpadded": 1}}}, "optim.pt")
    world = {0: {torch.float32: {"param": torch.ones(4), "numel_unpadded": 4}}}
    assert optimizer_state.coalesced(world, "optim.pt") == world  # Megatron's own format passes as it is


class FakeDDP(torch.nn.Module):
    """Megatron's DDP as verl's offload leaves it: one buffer whose device storage is freed, its values in the
    host tensor ``param_data.cpu_data``; a module buffer (the router's bias) stays on its device."""

    def __init__(self) -> None:
        super().__init__()
        self.module = torch.nn.Module()
        self.module.w1 = torch.nn.Parameter(torch.empty(2, 3))
        self.module.w2 = torch.nn.Parameter(torch.empty(4))
        self.module.register_buffer("bias", torch.tensor([1.0, 2.0]))
        data = torch.arange(16, dtype=torch.float32)
        self.module.w1.data = data[0:6].view(2, 3)
        self.module.w2.data = data[8:12]
        data.cpu_data = data.clone()
        data.untyped_storage().resize_(0)  # offloaded
        self.buffers = [
            SimpleNamespace(param_data=data, param_index_map={self.module.w1: (0, 6, 0), self.module.w2: (8, 12, 0)})
        ]
        self.expert_parallel_buffers = []


def test_offloaded_weights_are_read_from_verls_host_copy_without_a_copy() -> None:
    ddp = FakeDDP()
    host = ddp.buffers[0].param_data.cpu_data
    state = actor_state.model_state([ddp])
    assert sorted(state) == ["bias", "w1", "w2"]
    assert torch.equal(state["w1"], torch.arange(6, dtype=torch.float32).view(2, 3))
    assert torch.equal(state["w2"], torch.arange(8, 12, dtype=torch.float32))
    assert state["w1"].untyped_storage().data_ptr() == host.untyped_storage().data_ptr()
    assert torch.equal(state["bias"], torch.tensor([1.0, 2.0]))


def test_the_snapshot_file_saves_and_loads_the_views(tmp_path: Path) -> None:
    state = actor_state.model_state([FakeDDP()])
    torch.save({"model": state}, tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=True)["model"]
    assert all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.needs_components("megatron")
def test_the_upstream_offload_the_snapshot_relies_on_is_unchanged() -> None:
    from verl_patches.patching.fingerprint import fingerprint_target

    for target, fp in actor_state.RELIED_ON.items():
        assert fingerprint_target(target) == fp, target


def test_an_owned_snapshot_keeps_its_values_when_the_state_is_freed_or_changed() -> None:
    ddp = FakeDDP()
    live = torch.arange(4, dtype=torch.float32)
    snap = actor_state.ActorSnapshot(Path("role"), 2, None, None)
    snap.files.append(actor_state.FileToWrite("m.pt", {"model": actor_state.model_state([ddp]), "opt": [live]}))
    owned = snap.owned()
    ddp.buffers[0].param_data.cpu_data.zero_()  # what a background write must not see
    live.fill_(-1)
    kept = owned.files[0].obj
    assert torch.equal(kept["model"]["w2"], torch.arange(8, 12, dtype=torch.float32))
    assert torch.equal(kept["opt"][0], torch.arange(4, dtype=torch.float32))
    assert owned.nbytes == snap.nbytes
