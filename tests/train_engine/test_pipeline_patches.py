"""D4 uneven pipeline layers (pure rule + the wraps on a fake parallel state) and D3 shape exchange over gloo."""

from __future__ import annotations

import types

import pytest

from verl_patches.patches.megatron import pipeline_layers as pl


@pytest.mark.parametrize(
    "raw, expected",
    [
        ([7, 7, 8, 8, 8, 8, 8, 7], [7, 7, 8, 8, 8, 8, 8, 7]),
        ("7,7,8", [7, 7, 8]),
        ("[1, 2]", [1, 2]),
        ((3,), [3]),
        (None, None),
        ("", None),
        ([], None),
    ],
)
def test_parse_num_layer_list(raw, expected):
    assert pl.parse_num_layer_list(raw) == expected


@pytest.mark.parametrize("raw", ["7,x", [0, 3], "1,-1"])
def test_parse_rejects_bad_lists(raw):
    with pytest.raises(ValueError, match="num_layer_list"):
        pl.parse_num_layer_list(raw)


def test_a3_layout_offsets_cover_all_61_layers():
    counts = [7, 7, 8, 8, 8, 8, 8, 7]
    offsets = pl.layer_offsets(counts)
    assert offsets == [0, 7, 14, 22, 30, 38, 46, 54, 61]
    built = [list(range(offsets[i], offsets[i + 1])) for i in range(8)]
    assert sum(built, []) == list(range(61))
    pl.check_layout(counts, 61, 8)
    with pytest.raises(ValueError, match="sums to 61, the model has 62"):
        pl.check_layout(counts, 62, 8)
    with pytest.raises(ValueError, match="8 entries for pipeline size 4"):
        pl.check_layout(counts, 61, 4)


@pytest.fixture
def fake_pp(monkeypatch):
    from megatron.core import parallel_state

    state = types.SimpleNamespace(rank=0, size=8, vpp=None)
    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_rank", lambda: state.rank)
    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_world_size", lambda: state.size)
    monkeypatch.setattr(parallel_state, "get_virtual_pipeline_model_parallel_world_size", lambda: state.vpp)
    return state


def test_wraps_build_every_layer_of_an_uneven_split(fake_pp):
    build = pl.uneven_num_layers_to_build(lambda config: config.num_layers // 8)
    offset = pl.uneven_layer_offset(lambda layer: -1)
    per_stage, offsets = [], []
    for rank in range(8):
        fake_pp.rank = rank
        config = types.SimpleNamespace(num_layers=61, num_layer_list="7,7,8,8,8,8,8,7")
        per_stage.append(build(config))
        offsets.append(offset(types.SimpleNamespace(config=config)))
        assert config.layer_offset == [0, 7, 14, 22, 30, 38, 46, 54, 61]
    assert per_stage == [7, 7, 8, 8, 8, 8, 8, 7] and sum(per_stage) == 61
    assert offsets == [0, 7, 14, 22, 30, 38, 46, 54]


def test_wraps_defer_to_megatron_without_a_list_and_refuse_vpp(fake_pp):
    build = pl.uneven_num_layers_to_build(lambda config: 99)
    assert build(types.SimpleNamespace(num_layers=64, num_layer_list=None)) == 99
    assert build(types.SimpleNamespace(num_layers=64)) == 99
    fake_pp.vpp = 2
    with pytest.raises(ValueError, match="virtual pipeline"):
        build(types.SimpleNamespace(num_layers=61, num_layer_list=[30, 31]))


# ---- D3 over gloo ----------------------------------------------------------------------------------
def _shapes_scenario(rank: int, world: int) -> dict[str, str]:
    import verl_patches.prelude_patch  # noqa: F401  (our patch must replace Megatron's function)

    # isort: split
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import p2p_communication as p2p

    from tests.reshard.dist_harness import run_scenarios

    parallel_state.initialize_model_parallel(1, world)
    assert p2p._communicate_shapes.__module__ == "verl_patches.patches.megatron.p2p_shapes"

    def exchange(batch: bool):
        def run(r: int, w: int) -> None:
            cfg = types.SimpleNamespace(use_ring_exchange_p2p=False, batch_p2p_comm=batch, batch_p2p_sync=True)
            send = torch.zeros(5 + r, 1, 7)
            first, last = r == 0, r == w - 1
            prev, nxt = p2p._communicate_shapes(
                None if last else send, None if first else send, recv_prev=not first, recv_next=not last, config=cfg
            )
            assert prev == ([0, 0, 0] if first else [5 + r - 1, 1, 7]), prev
            assert nxt == ([0, 0, 0] if last else [5 + r + 1, 1, 7]), nxt

        return run

    return run_scenarios({"ordered": exchange(False), "batched": exchange(True)}, rank, world)


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_shape_exchange_forward_and_backward_over_three_stages():
    from tests.reshard.dist_harness import run_scenario_ranks

    for result in run_scenario_ranks(_shapes_scenario, world=3, timeout_s=120):
        assert result == {"ordered": "ok", "batched": "ok"}, result
