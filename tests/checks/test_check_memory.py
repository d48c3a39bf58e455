"""check_logprobs' memory estimate (pure) and the up-front refusal: the slice's bytes from the config and the
flags, the copies alive per phase and process, and one error naming the flags when the host cannot hold it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from verl_patches.checks.memory import (
    GIB,
    HEADROOM,
    LIBRARY_PAGES_BYTES,
    MAIN_PROCESS_BYTES,
    RANK_PROCESS_BYTES,
    estimate_memory,
    fit_problem,
)
from verl_patches.checks.truncate import truncated_config
from verl_patches.weights.config import make_tiny_config, make_training_config
from verl_patches.weights.hf_schema import hf_tensor_specs
from verl_patches.weights.layout import ParallelLayout


def _cfg(**kw):
    base = dict(
        num_hidden_layers=4,
        first_k_dense_replace=2,
        n_routed_experts=16,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=4,
    )
    base.update(kw)
    return make_tiny_config(64, **base)


def _layout(tp=1, pp=1, ep=1):
    return ParallelLayout(tp=tp, pp=pp, ep=ep, moe_grouped_gemm=True, moe_tp_extend_ep=True)


def _est(
    cfg,
    layers=None,
    experts=None,
    tp=1,
    pp=1,
    ep=1,
    rollout_ep=None,
    dtype=torch.bfloat16,
    stored=torch.bfloat16,
    engines=("megatron", "rollout"),
    convert=True,
):
    world = tp * pp * ep
    return estimate_memory(
        cfg,
        layers=layers,
        experts=experts,
        layout=_layout(tp, pp, ep),
        world=world,
        rollout_ep=rollout_ep or world,
        engine_dtype=dtype,
        checkpoint_dtype=stored,
        convert=convert,
        engines=engines,
        tokens=16,
        batch=2,
    )


@pytest.mark.parametrize(
    "layers,experts,dtype", list(itertools.product([None, 1, 2, 3, 4], [None, 8, 16], [torch.bfloat16, torch.float32]))
)
def test_one_copy_is_the_truncated_slice_in_the_engines_dtype(layers, experts, dtype):
    cfg = _cfg()
    est = _est(cfg, layers, experts, dtype=dtype, stored=torch.bfloat16)
    assert est.copy_bytes == sum(s.nbytes for s in hf_tensor_specs(truncated_config(cfg, layers, experts), dtype))


def test_single_rank_peak_is_two_copies_plus_the_process_baselines():
    cfg = _cfg()
    est = _est(cfg)
    assert [p.name for p in est.phases] == ["convert", "reference", "engines: load", "engines: sync"]
    assert est.peak.name == "engines: sync" and [u.process for u in est.peak.usage] == ["main", "rank0"]
    rank = est.peak.usage[1]
    # Megatron's rank holds the whole model at TP1/PP1/EP1; the stand-in the whole model too; the sync one
    # MoE layer's experts at most
    moe_layer = sum(s.nbytes for s in hf_tensor_specs(cfg) if s.name.startswith("model.layers.3.mlp.experts."))
    want = RANK_PROCESS_BYTES + (2 * est.copy_bytes + moe_layer) * HEADROOM
    assert rank.anon == pytest.approx(want, rel=1e-3)
    assert est.peak.usage[0].anon == MAIN_PROCESS_BYTES
    assert est.need_bytes <= est.rss_bound


def test_reference_phase_counts_the_mapped_checkpoint_apart():
    est = _est(_cfg(), dtype=torch.float32, stored=torch.bfloat16)
    ref = next(p for p in est.phases if p.name == "reference")
    (main,) = ref.usage
    assert main.mapped == LIBRARY_PAGES_BYTES + est.copy_bytes // 2  # the bf16 file behind an fp32 model
    assert main.anon > est.copy_bytes


def test_layers_experts_and_dtype_change_the_need_monotonically():
    cfg = _cfg()
    needs = [_est(cfg, layers=k).need_bytes for k in (1, 2, 3, 4)]
    assert needs == sorted(needs) and len(set(needs)) == 4
    assert _est(cfg, layers=4, experts=8).need_bytes < _est(cfg, layers=4).need_bytes
    assert _est(cfg, dtype=torch.float32).copy_bytes == pytest.approx(2 * _est(cfg).copy_bytes, rel=1e-2)


def test_every_rank_is_a_process_and_rank0_gathers_the_whole_rollout_at_ep2():
    cfg = _cfg()
    est = _est(cfg, ep=2)
    assert [p.name for p in est.phases][-3:] == ["engines: load", "engines: sync", "engines: gather"]
    for ph in est.phases[-3:]:
        assert [u.process for u in ph.usage] == ["main", "rank0", "rank1"]
    gather = est.phases[-1]
    assert gather.usage[1].anon > gather.usage[2].anon  # rank 0 builds the EP-1 instance, receives every expert
    sync = est.phases[-2]
    assert sync.usage[1].anon == sync.usage[2].anon  # each rank: its Megatron share + its stand-in share
    one = _est(cfg, ep=2, rollout_ep=1)  # each rank serves every expert: no gather
    assert "engines: gather" not in [p.name for p in one.phases]


def test_megatron_only_holds_no_rollout_copy():
    cfg = _cfg()
    assert _est(cfg, engines=("megatron",)).need_bytes < _est(cfg).need_bytes - 0.9 * _est(cfg).copy_bytes


def test_a_given_megatron_checkpoint_skips_the_conversion():
    assert "convert" not in [p.name for p in _est(_cfg(), convert=False).phases]


def test_the_671b_slice_of_the_issue_fits_24_gib_and_more_experts_do_not():
    cfg = make_training_config()  # DeepSeek-V3 671B: 61 layers, 256 routed experts, hidden 7168
    est = _est(cfg, layers=4, experts=16)
    assert 9.0e9 < est.copy_bytes < 9.2e9  # embedding + head 3.7 GB, 3 dense layers 3.5 GB, MoE layer 1.9 GB
    assert est.need_bytes < 22 * GIB
    assert fit_problem(est, 22 * GIB, layers=4, experts=16, dtype=torch.bfloat16) is None
    # every expert of the MoE layer: 256 x 88 MB more per copy
    wide = _est(cfg, layers=4)
    msg = fit_problem(wide, 22 * GIB, layers=4, experts=None, dtype=torch.bfloat16)
    assert msg and "--layers, now 4" in msg and "--experts, now all" in msg and "--dtype" not in msg
    fp32 = _est(cfg, layers=4, experts=16, dtype=torch.float32)
    msg = fit_problem(fp32, 22 * GIB, layers=4, experts=16, dtype=torch.float32)
    assert msg and "--dtype bfloat16" in msg and "phase 'engines: sync'" in msg


def test_estimate_lines_name_every_phase_and_process():
    est = _est(_cfg(), layers=3, experts=8, ep=2)
    text = "\n".join(est.lines())
    for word in (
        "truncate",
        "convert",
        "reference",
        "engines: load",
        "engines: sync",
        "engines: gather",
        "rank0",
        "rank1",
        "mapped",
        "one copy",
    ):
        assert word in text


def test_refusal_exits_2_before_any_work(tmp_path, monkeypatch, capsys):
    from tests.megatron_engine.golden_assets import build_hf_model
    from verl_patches.checks import memory
    from verl_patches.checks.cli import main

    hf = build_hf_model(tmp_path)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 * GIB)
    assert main(["--hf", str(hf), "--layers", "2", "--work-dir", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "memory estimate: one copy of the slice" in out.out
    assert "1.0 GiB available" in out.err and "--layers, now 2" in out.err and "--skip-memory-check" in out.err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("check_logprobs_")]


def test_checkpoint_dtype_reads_the_embedding(tmp_path):
    from verl_patches.checks.memory import checkpoint_dtype
    from verl_patches.weights.synthetic import write_synthetic_checkpoint

    cfg = make_tiny_config(32, num_hidden_layers=1, first_k_dense_replace=1)
    write_synthetic_checkpoint(tmp_path, cfg, num_shards=1)
    assert checkpoint_dtype(tmp_path) == torch.bfloat16
    with pytest.raises(Exception, match="not found"):
        checkpoint_dtype(Path(tmp_path / "absent"))
