"""A rollout-side receiver that runs vLLM's own DeepSeek loader (v0.9.1) on what the sync yields.

`VllmDeepseekReceiver` is an ``nn.Module`` whose parameter names are those of vLLM's DeepseekV3 model
(``gate_up_proj`` stacks, ``experts.w13_weight`` / ``w2_weight``, the rest as in the HF checkpoint), each
with a recording ``weight_loader``. `load` calls the unmodified ``DeepseekV2ForCausalLM.load_weights`` of
vLLM (vllm-ascend's override only filters names containing ``.module.``, done here too) with the receiver
as ``self``, so name matching, the stacked mapping and ``FusedMoE.make_expert_params_mapping`` are vLLM's.

Expert loaders behave like vLLM's FusedMoE with an expert map: an expert this rank does not serve is
skipped; it is also recorded as a violation if a non-empty tensor for it arrives (the sync must never
send one). Parameters are zero-size: the receiver keeps a copy of each loaded tensor in ``loaded``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn


def _set(root: nn.Module, dotted: str, param: nn.Parameter) -> None:
    *path, leaf = dotted.split(".")
    mod = root
    for part in path:
        if not hasattr(mod, part):
            mod.add_module(part, nn.Module())
        mod = getattr(mod, part)
    mod.register_parameter(leaf, param)


def vllm_param_names(cfg: Mapping[str, Any]) -> list[str]:
    """Parameter names of vLLM 0.9.1's DeepseekV3ForCausalLM (MLA with q LoRA, no MTP)."""
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [
            p + f"self_attn.{n}.weight"
            for n in (
                "q_a_proj",
                "q_a_layernorm",
                "q_b_proj",
                "kv_a_proj_with_mqa",
                "kv_a_layernorm",
                "kv_b_proj",
                "o_proj",
            )
        ]
        if layer < cfg["first_k_dense_replace"]:
            names += [p + "mlp.gate_up_proj.weight", p + "mlp.down_proj.weight"]
        else:
            names += [
                p + "mlp.gate.weight",
                p + "mlp.gate.e_score_correction_bias",
                p + "mlp.shared_experts.gate_up_proj.weight",
                p + "mlp.shared_experts.down_proj.weight",
                p + "mlp.experts.w13_weight",
                p + "mlp.experts.w2_weight",
            ]
    return names


class VllmDeepseekReceiver(nn.Module):
    def __init__(self, cfg: Mapping[str, Any], owned_experts: range):
        super().__init__()
        self.config = SimpleNamespace(
            n_routed_experts=cfg["n_routed_experts"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_nextn_predict_layers=0,
        )
        self.owned = owned_experts
        self.loaded: dict[tuple, torch.Tensor] = {}  # (vllm name, shard id or None, expert or None)
        self.violations: list[str] = []
        self.calls = 0
        for name in vllm_param_names(cfg):
            param = nn.Parameter(torch.empty(0), requires_grad=False)
            param.weight_loader = self._loader(name)
            _set(self, name, param)

    def _loader(self, pname: str):
        def load(param, weight, *args, **kwargs):
            self.calls += 1
            if "expert_id" in kwargs:  # FusedMoE.weight_loader(param, w, name, shard_id, expert_id)
                expert, shard = kwargs["expert_id"], kwargs["shard_id"]
                if expert not in self.owned:
                    if weight.numel():
                        self.violations.append(
                            f"{pname} expert {expert} (not served here) received {tuple(weight.shape)}"
                        )
                    return
                key = (pname, shard, expert)
            else:
                key = (pname, args[0] if args else None, None)
            if key in self.loaded:
                self.violations.append(f"{key} loaded twice")
            self.loaded[key] = weight.clone()

        return load

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM

        weights = ((n, w) for n, w in weights if ".module." not in n)
        return DeepseekV2ForCausalLM.load_weights(self, weights)

    def hf_view(self) -> dict[str, torch.Tensor]:
        """What was loaded, under HF names (stacked shards and expert shards taken apart)."""
        out = {}
        stacked = {0: "gate_proj", 1: "up_proj"}
        expert_proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
        for (pname, shard, expert), t in self.loaded.items():
            if expert is not None:
                prefix = pname.rsplit(".experts.", 1)[0]
                out[f"{prefix}.experts.{expert}.{expert_proj[shard]}.weight"] = t
            elif shard is not None:
                out[pname.replace("gate_up_proj", stacked[shard])] = t
            else:
                out[pname] = t
        return out
