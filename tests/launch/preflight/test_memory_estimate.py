"""The per-die memory model: parameter counts, activations, optimizer, rollout weights and KV cache,
checked against hand-computed values on the tiny DeepSeek-V3 shape and sanity figures of the 671B one."""

from __future__ import annotations

import pytest

from verl_patches.launch.preflight.memory_estimate import (
    ATLAS_A3_DIE,
    GIB,
    MIB,
    Component,
    DieSpec,
    PhaseEstimate,
    Recompute,
    RolloutSetup,
    TrainingSetup,
    attention_params,
    communicator_count,
    estimate_rollout,
    estimate_training,
    layer_activation_elems,
    mlp_params,
    optimizer_shard_bytes,
    rank_params,
    rollout_parameter_tensors,
    rollout_weight_bytes,
    rollout_workspace_bytes,
    stage_activation_bytes,
    total_params,
)
from verl_patches.reshard.model_dims import ModelDims
from verl_patches.weights.config import make_tiny_config, official_config

# make_tiny_config(512): h 64, vocab 512, 4 layers (1 dense), ffn 128, moe_ffn 32, 8 experts (top-2,
# 1 shared), 4 heads, q_lora 32, kv_lora 16, nope 16, rope 8, v 16.
TINY = ModelDims.from_hf_config(make_tiny_config(vocab_size=512))
DSV3 = ModelDims.from_hf_config(official_config())
LAYERS_671B = (7, 7, 8, 8, 8, 8, 8, 7)


def test_attention_and_mlp_params_by_hand():
    # replicated: (q_lora + kv_lora + rope) * h + q_norm + kv_norm + input_layernorm
    replicated = (32 + 16 + 8) * 64 + 32 + 16 + 64
    # split: q_b heads*(nope+rope)*q_lora + kv_b heads*(nope+v)*kv_lora + o_proj h*heads*v
    split = 4 * 24 * 32 + 4 * 32 * 16 + 64 * 4 * 16
    assert attention_params(TINY, 1) == replicated + split == 12912
    assert attention_params(TINY, 2) == replicated + split // 2
    assert mlp_params(TINY, 0, 2, 2).total == 3 * 64 * 128 // 2 + 64  # dense layer: no expert part
    moe = mlp_params(TINY, 1, 2, 2)
    assert moe.dense == 8 * 64 + 3 * 64 * 32 // 2 + 64  # router + shared experts / TP + norm
    assert moe.expert == 8 * 3 * 64 * 32 // 4  # 8 experts over TP x EP = 4 ranks


def test_total_params_match_transformers_model():
    torch = pytest.importorskip("torch")
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = make_tiny_config(vocab_size=512)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{k: v for k, v in cfg.items() if k != "architectures"}))
    assert total_params(TINY) == sum(p.numel() for p in model.parameters()) == 309504


def test_671b_total_and_per_die_share():
    assert total_params(DSV3) == pytest.approx(671.0e9, rel=1e-3)  # DeepSeek-V3's published 671B (no MTP)
    # Every stage's rank holds 1/(TP*EP) of the stage's routed experts (TP-extend-EP: 8 of 256 per layer).
    for stage in range(len(LAYERS_671B)):
        moe_layers = sum(1 for i in range(sum(LAYERS_671B[:stage]), sum(LAYERS_671B[: stage + 1])) if i >= 3)
        assert rank_params(DSV3, 4, 8, LAYERS_671B, stage).expert == moe_layers * 8 * 3 * 7168 * 2048
    # Summed over stages with TP=EP=1 the ranks hold the whole model once.
    assert sum(rank_params(DSV3, 1, 1, LAYERS_671B, s).total for s in range(8)) == total_params(DSV3)
    worst = max(rank_params(DSV3, 4, 8, LAYERS_671B, s).total for s in range(8))
    # BF16 per die: more than an even split of 671B over 256 dies (attention/shared parts are replicated
    # over EP), far less than over TP*PP = 32.
    assert 2 * 671e9 / 256 < 2 * worst < 2 * 671e9 / 32
    assert 2 * worst / GIB == pytest.approx(6.31, abs=0.01)


def test_rank_params_embedding_and_output_stages():
    s0 = rank_params(TINY, 2, 2, (2, 2), 0)
    s1 = rank_params(TINY, 2, 2, (2, 2), 1)
    layer0 = attention_params(TINY, 2) + 3 * 64 * 128 // 2 + 64
    layer_moe = attention_params(TINY, 2) + mlp_params(TINY, 1, 2, 2).total
    assert s0.total == 512 * 64 // 2 + layer0 + layer_moe
    assert s1.total == 2 * layer_moe + 512 * 64 // 2 + 64


def test_layer_activation_elems_by_hand():
    attn = 2 * 64 / 2 + 2 * 32 + (16 + 8) + 16 + 4 / 2 * (2 * (16 + 8) + 2 * 16)
    assert attn == 328
    moe = 2 * 64 / 2 + 2 * 8 / 2 + 2 * (2 * 64 + 3 * 32) / 2 + 3 * 32 / 2
    assert layer_activation_elems(TINY, 1, 2, True, True) == attn + moe == 672
    assert layer_activation_elems(TINY, 0, 2, True, True) == attn + 2 * 64 / 2 + 3 * 128 / 2 == 584
    # No SP: norm inputs are full, routed tokens are all local, expert FFN cut over TP.
    no_sp = 2 * 64 + 2 * 32 + 24 + 16 + 160 + 2 * 64 + 2 * 8 + 2 * (2 * 64 + 3 * 32 / 2) + 3 * 32 / 2
    assert layer_activation_elems(TINY, 1, 2, False, False) == no_sp


def _setup(**kw) -> TrainingSetup:
    base = dict(tp=2, pp=2, ep=2, cp=1, world=8, layer_list=(2, 2), seq_len=10, micro_batch=1, micro_batches_per_step=4)
    base.update(kw)
    return TrainingSetup(**base)


def test_activations_in_flight_logits_and_recompute():
    t = _setup()
    full0, full1 = 584 * 10 * 2, 672 * 10 * 2
    logits = 2 * 10 * 512 / 2 * 4
    assert stage_activation_bytes(TINY, t, 0) == (2 * (full0 + full1), 0.0)  # 1F1B: PP - 0 = 2 in flight
    assert stage_activation_bytes(TINY, t, 1) == (2 * full1 + logits, logits)  # last stage: 1 in flight
    block = _setup(recompute=Recompute("full", "block", 1))
    layer_input = 64 / 2 * 10 * 2
    assert stage_activation_bytes(TINY, block, 0)[0] == 2 * (layer_input + full1) + full0
    uniform = _setup(recompute=Recompute("full", "uniform", 2))
    assert stage_activation_bytes(TINY, uniform, 0)[0] == 2 * layer_input + full0 + full1
    selective = _setup(recompute=Recompute("selective"))
    assert stage_activation_bytes(TINY, selective, 0) == stage_activation_bytes(TINY, t, 0)


def test_optimizer_shard_distributed_and_not():
    p = rank_params(TINY, 2, 2, (2, 2), 1)
    assert optimizer_shard_bytes(_setup(), p) == 12 * (p.dense / 2 + p.expert / 1)  # DP 2, expert DP = DP/EP = 1
    assert optimizer_shard_bytes(_setup(distributed_optimizer=False), p) == 12 * p.total


def test_training_components_swap_offload_resident():
    big = DieSpec("test die", 1000 * GIB, "test")
    resident = estimate_training(TINY, _setup(), big, 300)
    parts = {c.name: c.nbytes for c in resident.components}
    p = rank_params(TINY, 2, 2, (2, 2), int(resident.extra["stage"]))
    assert parts["params_bf16"] == 2 * p.total and parts["grads_fp32"] == 4 * p.total
    assert parts["optimizer"] == optimizer_shard_bytes(_setup(), p) and parts["optimizer_step_extra"] == 0
    swap = {c.name: c.nbytes for c in estimate_training(TINY, _setup(swap_optimizer=True), big, 300).components}
    assert swap["optimizer"] == 0
    offload = {c.name: c.nbytes for c in estimate_training(TINY, _setup(optimizer_offload=True), big, 300).components}
    assert offload["optimizer"] == 0
    assert parts["hccl_buffers"] == communicator_count(_setup(), None) * 2 * 300 * MIB
    assert communicator_count(_setup(), None) == 6  # tp, pp, dp, ep, tp x ep, world (expert DP has size 1)


def test_verdict_thresholds():
    def phase(total: float) -> PhaseEstimate:
        return PhaseEstimate("x", (Component("a", total),), 100.0, "budget", "some.key")

    assert phase(90).verdict == "ok"
    assert phase(90.5).verdict == "warn"
    assert phase(100).verdict == "warn"
    assert phase(100.5).verdict == "fail"


def test_training_key_names_the_largest_lever():
    small = DieSpec("small", 1 * MIB, "test")
    no_swap = _setup(seq_len=1, distributed_optimizer=False)
    assert estimate_training(TINY, no_swap, small, 0).key == "actor_rollout_ref.actor.megatron.swap_optimizer"
    long = _setup(seq_len=100_000, swap_optimizer=True)
    assert estimate_training(TINY, long, small, 0).key == "actor_rollout_ref.model.enable_gradient_checkpointing"


def test_rollout_weights_kv_and_workspace_by_hand():
    r = RolloutSetup(
        tp=1, dp_per_instance=1, gpu_memory_utilization=0.5, max_num_seqs=4, max_model_len=16, max_num_batched_tokens=8
    )
    absorbed = 4 * (16 + 16) * 16  # vLLM's MLA copies derived from kv_b, per layer
    assert rollout_weight_bytes(TINY, r) == 2 * (total_params(TINY) + 4 * absorbed)
    assert TINY.kv_cache_bytes_per_token == (16 + 8) * 4 * 2
    assert DSV3.kv_cache_bytes_per_token == (512 + 64) * 61 * 2 == 70272
    per_token = 2 * 64 + 32 + 16 + 8 + 4 * (16 + 8 + 16) + 2 * (2 * 64 + 3 * 32)
    assert rollout_workspace_bytes(TINY, r) == 8 * per_token * 2 + 4 * 512 * 4
    # EP 3 over 8 experts: vLLM gives the last rank the remainder (4 experts), the weight model counts it.
    r3 = RolloutSetup(
        tp=1, dp_per_instance=3, gpu_memory_utilization=0.5, max_num_seqs=4, max_model_len=16, max_num_batched_tokens=8
    )
    assert rollout_weight_bytes(TINY, r) - rollout_weight_bytes(TINY, r3) == 2 * 3 * (8 - 4) * 3 * 64 * 32


def test_671b_rollout_fits_a3_with_kv_for_all_sequences():
    t = TrainingSetup(
        tp=4,
        pp=8,
        ep=8,
        cp=1,
        world=256,
        layer_list=LAYERS_671B,
        seq_len=4096,
        micro_batch=1,
        micro_batches_per_step=1024,
        swap_optimizer=True,
        param_offload=True,
        grad_offload=True,
        ref_param_offload=True,
    )
    for dp, experts_per_rank in ((64, 2), (128, 1)):
        r = RolloutSetup(
            tp=2,
            dp_per_instance=dp,
            gpu_memory_utilization=0.8,
            max_num_seqs=64,
            max_model_len=4096,
            max_num_batched_tokens=1024,
        )
        est = estimate_rollout(DSV3, t, r, ATLAS_A3_DIE, 300)
        assert est.vllm.verdict == "ok" and est.outside.verdict == "ok"
        assert est.kv_tokens >= est.kv_tokens_needed == 64 * 4096
        assert DSV3.num_experts // r.ep == experts_per_rank
        weights = rollout_weight_bytes(DSV3, r)
        assert 20 * GIB < weights < 30 * GIB  # TP2 attention/dense parts + 1 or 2 experts per MoE layer
    # Twice the experts per rank at EP128: exactly 58 MoE layers x one more expert of 3*h*f BF16 params.
    r64 = RolloutSetup(2, 64, 0.8, 64, 4096, 1024)
    r128 = RolloutSetup(2, 128, 0.8, 64, 4096, 1024)
    assert rollout_weight_bytes(DSV3, r64) - rollout_weight_bytes(DSV3, r128) == 2 * 58 * 3 * 7168 * 2048


def test_rollout_parameter_tensors_by_hand():
    """What unfrozen TorchAir graphs take as inputs per run: 906 tensors for DeepSeek-V3 (61 layers, 3 dense);
    the count of the built vLLM model is checked in tests/rollout/test_a3_engine_build.py."""
    assert rollout_parameter_tensors(DSV3) == 61 * (2 + 3 + 4) + 58 * 6 + 3 * 2 + 3 == 906


def test_the_lifecycle_finding_states_both_designs_costs():
    from omegaconf import OmegaConf

    from verl_patches.launch.preflight.memory import graph_rebuild_finding
    from verl_patches.launch.preflight.memory_estimate import ATLAS_A3_DIE, Component, PhaseEstimate

    cfg = OmegaConf.create(
        {
            "data": {"max_response_length": 3072},
            "actor_rollout_ref": {
                "rollout": {
                    "response_length": 3072,
                    "engine_kwargs": {
                        "vllm": {
                            "additional_config": {"torchair_graph_config": {"enabled": True, "graph_batch_sizes": [64]}}
                        }
                    },
                }
            },
        }
    )
    training = PhaseEstimate("train", (Component("weights", 30 * 2**30),), 64 * 2**30, "", "")
    f = graph_rebuild_finding(cfg, training, 20 * 2**30, ATLAS_A3_DIE, 906)
    assert f.check == "memory.rollout_weight_lifecycle" and f.status == "ok", f
    assert (
        "nothing is rebuilt: 0 GiB, about 2.8-8.3 s per step to refresh 906 weight addresses at each of 3072"
        in f.message
    )
    assert "Frozen parameters instead: the 1 graph(s) compiled again each step, about 0.5-1.5 min per step" in f.message


# ---- what the rollout engine holds for its life: the MC2 group's HCCL buffers and the TorchAir graph ----------

A3_TRAINING = dict(tp=4, pp=8, ep=8, cp=1, world=256, layer_list=LAYERS_671B, seq_len=4096, micro_batch=1)
# DeepSeek-V3 at rollout TP2, absorbed-MLA decode, per token of one layer (BF16 elements):
# 2h + q_lora + kv_lora + rope + heads/TP x (nope + rope + 2 x kv_lora + v) = 14336 + 1536 + 512 + 64 + 64 x 1344
DSV3_TP2_ATTENTION_PER_TOKEN = 102464


def _moe_layer(bs: int, rows: int, batch: int) -> int:
    """A MoE layer's feature map beyond attention: TP share in/out, MC2's rows through w13/act/w2, shared experts."""
    return bs * 2 * 7168 + rows * (2 * 7168 + 3 * 2048) + batch * 3 * 2048 // 2


@pytest.mark.parametrize(
    "layers, dp, seqs, bs, rows, expected",
    [
        # a3_256die_true_weight: graph batch 64 per DP rank, BS 64/2 = 32, A = 32 x EP128 x min(2, 8) = 8192
        (61, 64, 64, 32, 8192, 354_164_736),
        # a3_256die_random_init: EP256, A = 32 x 256 x min(1, 8) = 8192: the same feature map
        (61, 128, 64, 32, 8192, 354_164_736),
        # a3_16die_smoke (5 layers): graph batch 32, BS 16, A = 16 x EP16 x min(16, 8) = 2048
        (5, 8, 32, 16, 2048, 92_147_712),
    ],
)
def test_torchair_graph_feature_map_at_the_a3_profiles_by_hand(layers, dp, seqs, bs, rows, expected):
    from verl_patches.launch.preflight.memory_estimate import (
        graph_feature_map_bytes,
        rollout_mc2_sizes,
        torchair_graph_bytes,
    )

    cfg = official_config() | {"num_hidden_layers": layers}
    m = ModelDims.from_hf_config(cfg)
    r = RolloutSetup(2, dp, 0.8, seqs, 4096, 1024, (seqs,))
    assert rollout_mc2_sizes(m, r).bs == bs and rollout_mc2_sizes(m, r).receive_rows == rows
    elements = seqs * DSV3_TP2_ATTENTION_PER_TOKEN + _moe_layer(bs, rows, seqs)  # a MoE layer outweighs a dense one
    assert seqs * 3 * 18432 // 2 < _moe_layer(bs, rows, seqs)
    assert expected == 2 * elements + rows * 128 * 4  # + MC2's assist_info, int32
    assert graph_feature_map_bytes(m, r, seqs) == torchair_graph_bytes(m, r) == expected
    # two graph batch sizes hold two feature maps; graph mode off holds none
    two = RolloutSetup(2, dp, 0.8, seqs, 4096, 1024, (seqs // 2, seqs))
    assert torchair_graph_bytes(m, two) == graph_feature_map_bytes(m, two, seqs // 2) + expected
    assert torchair_graph_bytes(m, RolloutSetup(2, dp, 0.8, seqs, 4096, 1024)) == 0


def test_torchair_graph_feature_map_tiny_by_hand():
    from verl_patches.launch.preflight.memory_estimate import graph_feature_map_bytes

    r = RolloutSetup(1, 1, 0.5, 4, 16, 8, (4,))
    attention = 4 * (2 * 64 + 32 + 16 + 8 + 4 * (16 + 8 + 2 * 16 + 16))  # 1888
    dense = 4 * 3 * 128  # 1536
    rows = 4 * 1 * min(8, 2)  # EP1 holds all 8 experts, top-2
    moe = 4 * 2 * 64 + rows * (2 * 64 + 3 * 32) + 4 * 3 * 32  # 2688 > dense
    assert graph_feature_map_bytes(TINY, r, 4) == 2 * (attention + max(dense, moe)) + rows * 128 * 4 == 13248


def test_the_mc2_communicator_and_the_graph_are_held_in_every_phase():
    from verl_patches.launch.preflight.memory_estimate import estimate_ref, estimate_reshard

    t = TrainingSetup(
        **A3_TRAINING,
        micro_batches_per_step=1024,
        swap_optimizer=True,
        param_offload=True,
        grad_offload=True,
        ref_param_offload=True,
    )
    graph = RolloutSetup(2, 64, 0.8, 64, 4096, 1024, (64,))
    eager = RolloutSetup(2, 64, 0.8, 64, 4096, 1024)
    phases = {
        "training": lambda r: estimate_training(DSV3, t, ATLAS_A3_DIE, 300, r),
        "ref": lambda r: estimate_ref(DSV3, t, ATLAS_A3_DIE, 300, r),
        "reshard": lambda r: estimate_reshard(DSV3, t, r, ATLAS_A3_DIE, 300),
        "outside": lambda r: estimate_rollout(DSV3, t, r, ATLAS_A3_DIE, 300).outside,
    }
    for name, phase in phases.items():
        with_graph = {c.name: c.nbytes for c in phase(graph).components}
        without = {c.name: c.nbytes for c in phase(eager).components}
        assert with_graph["hccl_mc2_buffers"] == without["hccl_mc2_buffers"] == 2 * 300 * MIB, name
        assert with_graph["torchair_graph"] == 354_164_736 and "torchair_graph" not in without, name
        assert phase(graph).total_bytes - phase(eager).total_bytes == 354_164_736, name
        # the MC2 group is counted apart from the 9 other communicators (training 6, rollout TP/DP/EP 3)
        assert with_graph["hccl_buffers"] == 9 * 2 * 300 * MIB, name
    # vLLM's share is unchanged: the graph is captured after the KV cache is allocated
    assert (
        estimate_rollout(DSV3, t, graph, ATLAS_A3_DIE, 300).kv_tokens
        == estimate_rollout(DSV3, t, eager, ATLAS_A3_DIE, 300).kv_tokens
    )
    # no rollout: nothing of the engine's; a rollout without expert parallelism: no MC2 group
    assert "hccl_mc2_buffers" not in {c.name for c in estimate_training(DSV3, t, ATLAS_A3_DIE, 300).components}
    ep1 = estimate_rollout(DSV3, t, RolloutSetup(1, 1, 0.8, 64, 4096, 1024, (64,)), ATLAS_A3_DIE, 300).outside
    assert {c.name for c in ep1.components} >= {"torchair_graph"} and "hccl_mc2_buffers" not in {
        c.name for c in ep1.components
    }
