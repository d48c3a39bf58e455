"""What a save costs on A3, said by the dry run (issue 42): the time a save blocks the step, in the foreground
and written in the background (``overlay.async_checkpoint``), the host memory the background write holds, and
the trade-off of keeping one step or two, said in the storage refusal itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_preflight_checkpoint import A3, NPU, cfg_for, findings, folder, only
from verl_patches.launch.preflight import checkpoint as preflight_checkpoint
from verl_patches.launch.preflight.findings import FAIL, OK
from verl_patches.launch.preflight.memory_estimate import ParamCount
from verl_patches.launch.preflight.run_costs import (
    VENDOR_STEPS,
    RankLayout,
    background_save_rank_bytes,
    busiest_node,
    dense_gather_bytes,
    hidden_bandwidth,
    offloaded_host_bytes,
    save_timing,
)
from verl_patches.weights.config import official_config

GB = 1e9


def test_a_background_save_blocks_for_its_snapshot_and_what_the_next_steps_work_does_not_cover() -> None:
    vendor = VENDOR_STEPS["a3-256die-true-weight"]
    assert vendor.before_update_s == pytest.approx(373.65 + 17.0 + 5.0 + 0.21 + 144.5)
    t = save_timing(int(9.39e12), int(12e9), vendor.before_update_s, storage_bps=10e9, gather_bps=1e9)
    assert t.foreground_s == pytest.approx(939.0) and t.snapshot_s == pytest.approx(12.0)
    assert t.fence_s == pytest.approx(939.0 - 540.36) and t.background_s == pytest.approx(12.0 + 398.64)
    fast = save_timing(int(9.39e12), int(12e9), vendor.before_update_s, storage_bps=20e9)
    assert fast.fence_s == 0.0 and fast.background_s == fast.snapshot_s  # the write hides in the window
    assert hidden_bandwidth(int(9.39e12), 540.36) == pytest.approx(9.39e12 / 540.36)


@settings(max_examples=200, deadline=None)
@given(
    step=st.integers(1, 10**13),
    gather=st.integers(0, 10**11),
    window=st.floats(0, 1e4),
    bps=st.floats(1e8, 1e11),
)
def test_a_background_save_never_blocks_longer_than_its_snapshot_plus_the_foreground_write(
    step: int, gather: int, window: float, bps: float
) -> None:
    t = save_timing(step, gather, window, storage_bps=bps)
    assert 0.0 <= t.fence_s <= t.foreground_s
    assert t.background_s <= t.snapshot_s + t.foreground_s
    if window >= t.write_s:
        assert t.fence_s == 0.0


def a3_layout() -> RankLayout:
    return preflight_checkpoint.rank_layout(cfg_for("a3_256die_true_weight", "/shared/ckpt")[0], official_config())


def test_megatrons_rank_order_puts_dense_dp_rank_zero_first_in_each_stage() -> None:
    lay = a3_layout()
    assert (lay.tp, lay.cp, lay.dp, lay.expert_dp, lay.ranks_per_node, lay.world) == (4, 1, 8, 1, 16, 256)
    zeros = [r for r in range(lay.world) if lay.dense_dp_zero(r)]
    assert zeros == [s * 32 + t for s in range(8) for t in range(4)]  # one per (tp, pp), TP x CP apart
    assert [lay.stage_of(r) for r in (0, 31, 32, 255)] == [0, 0, 1, 7]


def test_the_background_write_holds_the_weights_old_host_copy_and_the_gathered_dense_state() -> None:
    p = ParamCount(dense=100, expert=1000)
    lay = RankLayout(tp=2, cp=1, dp=4, expert_dp=1, ranks_per_node=4, stage_params=(p, p))
    # DP rank 0: weights (2 B) + the dense group's gathered state (12 B); the experts' one-rank group: their
    # host buffers as they are (swap optimizer), a host copy of them without it
    assert background_save_rank_bytes(lay, 0, swap_optimizer=True) == 2 * 1100 + 12 * 100
    assert background_save_rank_bytes(lay, 2, swap_optimizer=True) == 2 * 1100
    assert background_save_rank_bytes(lay, 2, swap_optimizer=False) == 2 * 1100 + 12 * 1000
    assert offloaded_host_bytes(lay, 2, True, True, True) == 2 * 2 * 1100 + 12 * 100 / 4 + 12 * 1000
    node, held = busiest_node(lay, lambda r: background_save_rank_bytes(lay, r, True))
    assert (node, held) == (0, 4 * 2 * 1100 + 2 * 12 * 100)
    assert dense_gather_bytes(lay) == 12 * 100
    assert dense_gather_bytes(RankLayout(1, 1, 1, 1, 1, (p,))) == 0.0


def test_on_a3_the_write_holds_a_sixth_of_what_the_offloaded_state_holds_per_node() -> None:
    lay = a3_layout()
    node, held = busiest_node(lay, lambda r: background_save_rank_bytes(lay, r, swap_optimizer=True))
    steady = busiest_node(lay, lambda r: offloaded_host_bytes(lay, r, True, True, True))[1]
    assert 130 * GB < held < 140 * GB and 760 * GB < steady < 780 * GB
    without_swap = busiest_node(lay, lambda r: background_save_rank_bytes(lay, r, swap_optimizer=False))[1]
    assert without_swap > 4 * held  # the experts' state copied from the device: why the swap optimizer matters


@pytest.mark.parametrize("profile", A3)
def test_the_dry_run_states_what_a_save_blocks_with_and_without_the_background(profile: str) -> None:
    on = only(findings(profile, "/shared/ckpt/dsv3"), "checkpoint.cadence")
    assert on.status == OK and "\n" not in on.message
    vendor = VENDOR_STEPS[{"a3_256die_true_weight": "a3-256die-true-weight"}.get(profile, "a3-256die-random-init")]
    fence = round(939.0 - vendor.before_update_s)
    assert f"a save is written in the background (overlay.async_checkpoint=True) and blocks about {12 + fence} s" in (
        on.message
    )
    assert f"12 s for its snapshot + {fence} s at the fence before the next update" in on.message
    assert "the 939 s write has overlapped the next step's rollout, weight switch, reward and reference" in on.message
    assert "against 939 s" in on.message and "in the foreground" in on.message
    assert "storage writing 10 GB/s and the snapshot's DP gather 1 GB/s (assumptions)" in on.message
    assert "the write holds up to 137.21 GB of host memory on the busiest node (ranks 224-239)" in on.message
    assert "beside the 771.53 GB its offloaded weights and optimizer state take there" in on.message

    off = only(findings(profile, "/shared/ckpt/dsv3", "overlay.async_checkpoint=False"), "checkpoint.cadence")
    assert "a save blocks the step for its whole write, 939 s (" in off.message
    assert "overlay.async_checkpoint=True writes it in the background" in off.message


def test_on_an_npu_node_the_line_names_its_host_memory(monkeypatch) -> None:
    monkeypatch.setattr(preflight_checkpoint, "host_memory_bytes", lambda: 1_500_000_000_000)
    f = only(findings("a3_256die_true_weight", "/shared/ckpt/dsv3", host=NPU), "checkpoint.cadence")
    assert f.message.endswith("(this node has 1.50 TB)")


@pytest.mark.parametrize(("node_bytes", "fits"), [(1_500_000_000_000, True), (1_000_000_000_000, False)])
def test_a_background_write_that_does_not_fit_the_nodes_memory_fails_the_dry_run(
    monkeypatch, node_bytes: int, fits: bool
) -> None:
    """137 GB written from beside 772 GB offloaded: 909 GB, within 90 % of a 1.5 TB node, not of a 1 TB one."""
    monkeypatch.setattr(preflight_checkpoint, "host_memory_bytes", lambda: node_bytes)
    f = only(findings("a3_256die_true_weight", "/shared/ckpt/dsv3", host=NPU), "checkpoint.cadence")
    assert "\n" not in f.message
    if fits:
        assert f.status == OK and f.message.endswith(f"(this node has {node_bytes / 1e12:.2f} TB)")
        return
    assert f.status == FAIL and f.key == "overlay.async_checkpoint", f
    assert f.message.endswith(
        "together 908.74 GB, more than 90% of this node's 1.00 TB; set overlay.async_checkpoint=False (a save in "
        "the foreground holds no copy) or offload less"
    ), f.message
    off = only(
        findings("a3_256die_true_weight", "/shared/ckpt/dsv3", "overlay.async_checkpoint=False", host=NPU),
        "checkpoint.cadence",
    )
    assert off.status == OK, off  # a foreground save holds no second copy


def test_the_storage_refusal_states_the_keep_one_or_two_trade_off(tmp_path: Path) -> None:
    ck = folder(tmp_path)  # a few GB free here, 28 TB needed for the 671B model
    f = only(findings("a3_256die_true_weight", str(ck)), "checkpoint.storage")
    assert f.status == FAIL and "\n" not in f.message and f.key == "CKPT_DIR / trainer.max_actor_ckpt_to_keep"
    assert "free, needs 28.18 TB for 2 kept step(s) (trainer.max_actor_ckpt_to_keep) + 1 being written" in f.message
    assert (
        "keep 2 (the default) needs 3 steps of space (28.18 TB) because a save commits before it prunes; "
        "keep 1 (trainer.max_actor_ckpt_to_keep=1) needs 2 steps (18.79 TB) but a damaged newest step leaves none "
        "to resume from"
    ) in f.message

    one = only(findings("a3_256die_true_weight", str(ck), "trainer.max_actor_ckpt_to_keep=1"), "checkpoint.storage")
    assert one.status == FAIL and "needs 18.79 TB for 1 kept step(s)" in one.message
    assert (
        "keep 1 (trainer.max_actor_ckpt_to_keep=1) needs 2 steps of space (18.79 TB) because a save commits before "
        "it prunes, and a damaged newest step leaves none to resume from; keep 2 (the default) needs 3 (28.18 TB)"
    ) in one.message
