"""The foundation of the A3 train engine on CPU: MindSpeed-LLM + MindSpeed + Megatron core_r0.8.0 over the
torch_npu emulation, 2 gloo processes, the tiny DeepSeek-V3 GPTModel (MLA, dense + MoE layers, grouped
GEMM, shared expert, router expert bias) with the A3 profile's MindSpeed features: forward, backward and
a distributed-optimizer step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_patches.multirank import run_rank_scripts

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.timeout(400)]


def run_engine(
    tmp_path: Path,
    tp: int,
    ep: int,
    sp: bool,
    pp: int = 1,
    layers: str = "",
    fix_router: bool = False,
    swap_optimizer: bool = False,
) -> list[dict]:
    env = {
        "PYTHONPATH": str(REPO),
        "VERL_PATCHES_DEVICE": None,
        "TP": str(tp),
        "EP": str(ep),
        "SP": "1" if sp else "0",
        "PP": str(pp),
        "LAYERS": layers,
        "FIX_ROUTER": "1" if fix_router else "0",
        "SWAP": "1" if swap_optimizer else "0",
        "VERL_PATCHES_QUIET": "1",
        "OMP_NUM_THREADS": "1",
    }
    outs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    run_rank_scripts(
        "tests.train_engine.engine_worker",
        2,
        360,
        module=True,
        args=lambda rank: [str(outs[rank])],
        rank_env=[env, env],
        cwd=REPO,
    )
    return [json.loads(out.read_text()) for out in outs]


def check_common(r: dict) -> None:
    assert r["argv_restored"] and r["compile_is_real"]
    assert "rlxf" not in r["rank_generator_module"]  # Ray's --raylet-name never reached MindSpeed-LLM's adaptor
    assert all(r["flags"][k] for k in r["flags"] if k != "sequence_parallel"), r["flags"]
    assert r["layers"] == ["MLP", "MoELayer", "MoELayer"], r["layers"]
    assert r["attention"] == "MultiHeadLatentAttention" and r["experts"] == "GroupedMLP"
    assert r["shared_experts"] and r["expert_bias"]
    assert r["step_ok"] and r["grad_norm"] > 0
    # Every weight moves except RMSNorm scales: they start at 1.0, where a bf16 step of ~lr (1e-3) is below
    # half an ulp (2^-8) and rounds back (the fp32 main copy in the optimizer does move).
    assert r["unchanged"] and all("layernorm" in n for n in r["unchanged"]), r["unchanged"]
    for op in (
        "npu_rms_norm",
        "npu_fusion_attention",
        "npu_swiglu",
        "builder:npu_rotary_position_embedding",
        "builder:grouped_matmul",
        "builder:npu_groupmatmul_add_fp32",
        "builder:npu_moe_token_permute",
        "builder:npu_moe_token_unpermute",
    ):
        assert r["calls"].get(op, 0) > 0, (op, r["calls"])


def test_ep2_forward_backward_swap_distributed_optimizer_step(tmp_path):
    """EP2 with the A3 profile's swap optimizer (MindSpeed's SwapDistributedOptimizer over the emulated fused
    AdamW): the step moves every weight (checked in check_common)."""
    results = run_engine(tmp_path, tp=1, ep=2, sp=False, swap_optimizer=True)
    for r in results:
        check_common(r)
        assert (r["tp"], r["ep"], r["dp"]) == (1, 2, 2)
        assert r["router_indices"] != FIXED_ROUTING  # learned routing unless fix_router is set
        assert r["optimizers"] and all(name == "SwapDistributedOptimizer" for name in r["optimizers"]), r["optimizers"]


FIXED_ROUTING = [[(2 * t + k) % 4 for k in range(2)] for t in range(6)]  # MindSpeed-LLM's fix_router rule


def test_tp2_sequence_parallel_tp_extend_ep_with_fix_router(tmp_path):
    results = run_engine(tmp_path, tp=2, ep=1, sp=True, fix_router=True)
    for r in results:
        check_common(r)
        assert (r["tp"], r["ep"], r["dp"]) == (2, 1, 1) and r["flags"]["sequence_parallel"]
    # fix_router (random-init benchmark profile): token slots go round-robin over the experts. With TP-extend-EP
    # the router keeps this rank's share of the tokens, so the rule holds on each rank's slice.
    for r in results:
        flat = [e for row in r["router_indices"] for e in row]
        assert flat == [i % 4 for i in range(len(flat))], r["router_indices"]


def test_pp2_uneven_layer_list_pipeline_schedule_step(tmp_path):
    """PP2 with layers [1, 2] (D4): stage 0 builds the dense layer 1, stage 1 the MoE layers 2 and 3; a
    pipeline step over micro-batches of different lengths exchanges shapes first (D3, our one-pass
    version in place of MindSpeed's); EP=1 takes MindSpeed's all-to-all overlap path (handle fix)."""
    first, last = run_engine(tmp_path, tp=1, ep=1, sp=False, pp=2, layers="1,2")
    assert (first["pp_rank"], last["pp_rank"]) == (0, 1)
    assert first["layers"] == ["MLP"] and first["layer_numbers"] == [1]
    assert last["layers"] == ["MoELayer", "MoELayer"] and last["layer_numbers"] == [2, 3]
    for r in (first, last):
        assert r["communicate_shapes"] == "verl_patches.patches.megatron.p2p_shapes"
        assert r["step_ok"] and r["grad_norm"] > 0 and r["argv_restored"] and r["compile_is_real"]
    assert len(last["pp_losses"]) == 2 and all(v > 0 for v in last["pp_losses"])
