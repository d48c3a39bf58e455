"""Assets and rank-side steps of the golden test: a tiny DeepSeek-V3 in HF format (random init, MLA, 1 dense +
2 MoE layers, 8 routed experts, a shared expert, a non-zero routing bias), converted by our converter, and the
verl worker calls the A3 job makes (actor and reference through ``ActorRolloutRefWorker``), compared with
HF transformers' per-token log-probs and autograd gradients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

HF_OVERRIDES = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    n_routed_experts=8,
    n_group=1,
    topk_group=1,
    num_experts_per_tok=2,
    n_shared_experts=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=256,
)
PROMPT, RESPONSE, BATCH = 6, 5, 4
TEMPERATURE = 0.9  # the A3 profile's rollout.temperature


def build_hf_model(root: Path, seed: int = 0) -> Path:
    """HF checkpoint + tokenizer in ``root/hf``; vocabulary padded to a multiple of 4 (TP2 and EP2 divide it)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from verl_patches.cpu_proof.tiny_assets import build_tokenizer
    from verl_patches.weights.config import make_tiny_config

    out = root / "hf"
    tok = build_tokenizer(out, ["What is 1 + 2 ? The answer is 3 ."], max_operand=9)
    vocab = (len(tok) + 3) // 4 * 4
    cfg = make_tiny_config(vocab_size=vocab, **HF_OVERRIDES)
    cfg["rope_scaling"] = dict(cfg["rope_scaling"], original_max_position_embeddings=64, factor=4.0)
    # aux_loss_alpha=0: HF's DeepseekV3 has no load-balancing loss, MindSpeed-LLM's sequence aux loss would add
    # its gradient (through the next MoE layer's router) to the expert gradients compared with HF autograd
    cfg.update(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
        aux_loss_alpha=0.0,
    )
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(
                torch.randn(p.shape, generator=g) * (0.02 if p.dim() > 1 else 1.0) + (1.0 if "norm" in name else 0.0)
            )
        for layer in model.model.layers[cfg["first_k_dense_replace"] :]:
            # a routing bias that changes which experts are chosen, so a dropped bias would show
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(cfg["n_routed_experts"], generator=g) * 0.05)
    model.save_pretrained(out, safe_serialization=True)
    return out


def convert(hf_dir: Path, out: Path, tp: int, pp: int, ep: int, num_layer_list: tuple[int, ...] | None) -> Path:
    from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore
    from verl_patches.weights.layout import ParallelLayout

    layout = ParallelLayout(
        tp=tp, pp=pp, ep=ep, num_layer_list=num_layer_list, moe_grouped_gemm=True, moe_tp_extend_ep=True
    )
    convert_hf_to_mcore(hf_dir, out, layout, progress=False)
    return out


def make_batch(vocab: int, seed: int = 5) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses, as verl's rollout hands them over."""
    g = torch.Generator().manual_seed(seed)
    s = PROMPT + RESPONSE
    input_ids = torch.randint(4, vocab, (BATCH, s), generator=g)
    mask = torch.ones(BATCH, s, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, :1] = 0
    mask[2, -2:] = 0
    input_ids[mask == 0] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    adv = torch.randn(BATCH, generator=g)[:, None].expand(BATCH, RESPONSE).contiguous()
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": position_ids,
        "responses": input_ids[:, -RESPONSE:].clone(),
        "advantages": adv,
    }


def hf_log_probs(
    hf_dir: Path,
    batch: dict[str, torch.Tensor],
    temperature: float,
    dtype: torch.dtype = torch.float32,
    grad: bool = False,
) -> tuple[torch.Tensor, Any]:
    """HF transformers' per-token log-probs of the responses at ``temperature`` (and the model, for autograd)."""
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM.from_pretrained(hf_dir, torch_dtype=dtype, attn_implementation="eager")
    model.train(grad)
    with torch.set_grad_enabled(grad):
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits.float()
        logits = logits[:, -RESPONSE - 1 : -1] / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None])[..., 0]
    return lp, model


def worker_config(hf_dir: Path, ckpt: Path, tp: int, pp: int, ep: int, layer_list: list[int] | None) -> Any:
    from omegaconf import open_dict

    from verl_patches.trainer.config_compose import compose_config

    a = "actor_rollout_ref"
    overrides = [
        f"{a}.model.path={hf_dir}",
        f"{a}.rollout.n=1",
        f"{a}.rollout.temperature={TEMPERATURE}",
        f"{a}.rollout.prompt_length={PROMPT}",
        f"{a}.rollout.response_length={RESPONSE}",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{a}.ref.log_prob_micro_batch_size_per_gpu=2",
        f"{a}.actor.ppo_mini_batch_size={BATCH}",
        f"{a}.actor.ppo_micro_batch_size_per_gpu=1",
        f"{a}.actor.use_kl_loss=False",
        f"{a}.actor.optim.lr=1e-2",
        f"{a}.actor.load_weight=True",
        f"{a}.ref.load_weight=True",
    ]
    for role in ("actor", "ref"):
        m = f"{a}.{role}.megatron"
        overrides += [
            f"{m}.tensor_model_parallel_size={tp}",
            f"{m}.pipeline_model_parallel_size={pp}",
            f"{m}.expert_model_parallel_size={ep}",
            f"{m}.use_dist_checkpointing=True",
            f"{m}.dist_checkpointing_path={ckpt}",
        ]
    cfg = compose_config("ppo_mindspeed_trainer", overrides)
    with open_dict(cfg):
        cfg.actor_rollout_ref.actor.megatron.pipeline_parallel_num_layer_list = layer_list
        cfg.actor_rollout_ref.actor.megatron.sequence_parallel = tp > 1
    return cfg


class DictSource:
    """HF-named tensors held in memory, as the converter's ``TensorSource`` (to lay out HF gradients the way
    a Megatron rank holds its parameters)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.t = tensors

    def get(self, name: str) -> torch.Tensor:
        return self.t[name]

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.t[name][start:stop]

    def cols(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.t[name][:, start:stop]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.t[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.t[name].dtype


def expert_grads_as_rank(
    hf_grads: dict[str, torch.Tensor], cfg: dict, hf_layer: int, tp: int, pp: int, ep: int, rank: tuple[int, int, int]
) -> dict[str, torch.Tensor]:
    """HF autograd gradients of one MoE layer's routed experts, in the grouped-GEMM layout rank (tp, pp, ep)
    holds (``weight1``: gate/up of its experts, ``weight2``: down), built by the converter's own layout code."""
    from verl_patches.weights import tensor_layout as tl
    from verl_patches.weights.layout import ParallelLayout, Rank, expert_slice_index, expert_tp, local_experts

    layout = ParallelLayout(tp=tp, pp=pp, ep=ep, moe_grouped_gemm=True, moe_tp_extend_ep=True)
    r = Rank(*rank)
    src = DictSource(hf_grads)
    hp = f"model.layers.{hf_layer}.mlp.experts."
    experts = local_experts(layout, cfg["n_routed_experts"], r)
    parts, idx = expert_tp(layout), expert_slice_index(layout, r)
    w1 = tl.build_grouped_w1(
        src, [(f"{hp}{e}.gate_proj.weight", f"{hp}{e}.up_proj.weight") for e in experts], parts, idx
    )
    w2 = tl.build_grouped_w2(src, [f"{hp}{e}.down_proj.weight" for e in experts], parts, idx)
    return {"weight1": w1, "weight2": w2}
