"""The stand-in's `model_runner.model`: vLLM-named parameters, computed with by transformers' DeepseekV3.

Storage lives in the vLLM-named parameters (`named_parameters()` lists exactly vLLM's names and
shapes at TP 1, EP-local experts only). The HF modules hold plain-tensor views into them, re-bound
before every forward (`bind_views`), so a lifecycle that rebinds `param.data` (offload/onload) is seen.
`load_weights` is vLLM's own `DeepseekV2ForCausalLM.load_weights` run with this module as `self`.
Each layer exposes `self_attn.mla_attn.impl` with the MLA absorbed matrices (`W_UK_T`, `W_UV`) rebuilt
from `kv_b_proj` by `process_weights_after_loading`, as vllm-ascend's AscendMLAImpl does after a load.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from verl_patches.rollout.standin.weights import Slot, local_experts, vllm_layout


class StandinError(RuntimeError):
    pass


class _RemoteExpert(nn.Module):
    """An expert another EP rank serves: it contributes nothing here (vLLM's expert map, -1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


class MLAImpl:
    """The absorbed MLA matrices vllm-ascend derives from kv_b_proj (W_UK_T: [H, nope, kv_lora],
    W_UV: [H, kv_lora, v]); rebuilt after every weight load, cleared on offload."""

    def __init__(self, owner: StandinDeepseekV3, layer: int) -> None:
        self._owner, self._layer = owner, layer
        self.W_UK_T: torch.Tensor | None = None
        self.W_UV: torch.Tensor | None = None

    def process_weights_after_loading(self, act_dtype: torch.dtype | None = None) -> None:
        cfg = self._owner.config
        w = self._owner.get_parameter(f"model.layers.{self._layer}.self_attn.kv_b_proj.weight").data
        h, nope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        w = w.view(h, nope + v, cfg.kv_lora_rank)
        self.W_UK_T = w[:, :nope, :].transpose(1, 2).contiguous().transpose(1, 2)  # [H, nope, kv_lora]
        self.W_UV = w[:, nope:, :].transpose(1, 2).contiguous()  # [H, kv_lora, v]
        if act_dtype is not None:
            self.W_UK_T, self.W_UV = self.W_UK_T.to(act_dtype), self.W_UV.to(act_dtype)


def _set_param(root: nn.Module, dotted: str, param: nn.Parameter) -> None:
    *path, leaf = dotted.split(".")
    mod = root
    for part in path:
        if part not in mod._modules:
            mod.add_module(part, nn.Module())
        mod = mod._modules[part]
    mod.register_parameter(leaf, param)


class StandinDeepseekV3(nn.Module):
    def __init__(
        self,
        hf_config: Any,
        dtype: torch.dtype = torch.float32,
        ep_size: int = 1,
        ep_rank: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        # lazy: transformers is heavy and only this path needs it; importing this module stays light
        from transformers import DeepseekV3ForCausalLM

        self.config = hf_config
        self.ep_size, self.ep_rank = ep_size, ep_rank
        self.experts = local_experts(hf_config.n_routed_experts, ep_size, ep_rank)
        hf = DeepseekV3ForCausalLM(hf_config).to(dtype=dtype, device=device).eval()
        for layer in hf.model.layers:  # keep only this rank's experts, like vLLM's FusedMoE with an expert map
            if hasattr(layer.mlp, "experts"):
                for e in range(hf_config.n_routed_experts):
                    if e not in self.experts:
                        layer.mlp.experts[e] = _RemoteExpert()
        # Parameters and persistent buffers (the router's e_score_correction_bias is a buffer in HF and a
        # parameter in vLLM): everything a checkpoint carries.
        hf_params = {n: t for n, t in hf.state_dict(keep_vars=True).items()}
        shapes, self._slots = vllm_layout(
            {n: p.shape for n, p in hf_params.items()}, hf_config.n_routed_experts, self.experts
        )
        for vname, shape in shapes.items():
            param = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
            _set_param(self, vname, param)
        self._hf_modules: dict[str, tuple[nn.Module, str]] = {}
        for name in self._slots:
            mod_name, _, leaf = name.rpartition(".")
            module = hf.get_submodule(mod_name)
            src = hf_params[name].data
            self._view(self._slots[name]).copy_(src)  # start from the HF initialisation (dummy load format)
            (module._parameters if leaf in module._parameters else module._buffers).pop(leaf)
            self._hf_modules[name] = (module, leaf)
        object.__setattr__(self, "hf", hf)  # not a submodule: its tensors are views of ours
        self._attach_loaders()
        for i in range(hf_config.num_hidden_layers):
            self.get_submodule(f"model.layers.{i}.self_attn").mla_attn = SimpleNamespace(impl=MLAImpl(self, i))
        self.bind_views()
        self.process_weights_after_loading()

    # ---- views -------------------------------------------------------------------------------
    def _view(self, slot: Slot) -> torch.Tensor:
        t = self.get_parameter(slot.vllm_name).data
        if slot.expert is not None:
            t = t[slot.expert]
        if slot.rows is not None:
            t = t[slot.rows[0] : slot.rows[1]]
        return t

    def bind_views(self) -> None:
        """Point every HF tensor at its place in the vLLM-named parameters (after any param.data rebind)."""
        for name, (module, leaf) in self._hf_modules.items():
            setattr(module, leaf, self._view(self._slots[name]))

    @property
    def layers(self) -> list[nn.Module]:
        return [self.get_submodule(f"model.layers.{i}") for i in range(self.config.num_hidden_layers)]

    # ---- loading (vLLM's own loader) ----------------------------------------------------------
    def _attach_loaders(self) -> None:
        # deferred: importing this module must not load vLLM; it loads once the prelude patched it
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        for name, param in self.named_parameters():
            if ".mlp.experts.w" in name:
                param.weight_loader = self._expert_loader
            elif "gate_up_proj" in name:
                param.weight_loader = self._stacked_loader
            else:
                param.weight_loader = default_weight_loader

    @staticmethod
    def _copy(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
        if dst.shape != src.shape:
            raise StandinError(f"{what}: vLLM's layout expects shape {tuple(dst.shape)}, got {tuple(src.shape)}")
        dst.copy_(src)

    def _stacked_loader(self, param: nn.Parameter, weight: torch.Tensor, shard_id: int) -> None:
        rows = param.data.shape[0] // 2
        self._copy(param.data[shard_id * rows : (shard_id + 1) * rows], weight, f"gate_up_proj shard {shard_id}")

    def _expert_loader(
        self,
        param: nn.Parameter,
        weight: torch.Tensor,
        weight_name: str,
        shard_id: str,
        expert_id: int,
        return_success: bool = False,
    ) -> bool | None:
        if expert_id not in self.experts:  # served by another EP rank: skipped, as vLLM's FusedMoE does
            return False if return_success else None
        local = self.experts.index(expert_id)
        if shard_id == "w2":
            self._copy(param.data[local], weight, f"{weight_name} expert {expert_id}")
        else:
            rows = param.data.shape[1] // 2
            start = 0 if shard_id == "w1" else rows
            self._copy(param.data[local, start : start + rows], weight, f"{weight_name} expert {expert_id} {shard_id}")
        return True if return_success else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM 0.9.1's DeepseekV2ForCausalLM.load_weights, unmodified, with this module as `self`."""
        # deferred: importing this module must not load vLLM; it loads once the prelude patched it
        from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM

        filtered = ((n, w) for n, w in weights if ".module." not in n)  # vllm-ascend's override does this
        try:
            return DeepseekV2ForCausalLM.load_weights(self, filtered)
        except KeyError as e:
            raise StandinError(f"vLLM's DeepSeek loader does not accept the weight name {e}") from None

    def process_weights_after_loading(self, act_dtype: torch.dtype | None = None) -> None:
        for layer in self.layers:
            layer.self_attn.mla_attn.impl.process_weights_after_loading(act_dtype)

    # ---- compute -----------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        if self.ep_size > 1:
            raise StandinError(
                "the CPU stand-in computes with EP size 1 only (it holds EP-local experts at any "
                "EP size; vllm-ascend's EP all-gather/reduce-scatter needs its kernels)"
            )
        self.bind_views()
        return self.hf(input_ids=input_ids, **kwargs)
