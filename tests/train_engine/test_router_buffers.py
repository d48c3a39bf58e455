"""The router's float32 buffers survive Megatron's bf16 Float16Module (and the checkpoint loads unrounded)."""

from __future__ import annotations

import pytest
import torch

from verl_patches.train_engine.router_buffers import keep_router_buffers_float32


class Router(torch.nn.Module):
    """The two buffers MindSpeed-LLM's DeepSeek-V3 router registers, as it registers them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 8))
        self.register_buffer("local_tokens_per_expert", torch.zeros(4, dtype=torch.float32), persistent=False)
        self.register_buffer("expert_bias", torch.zeros(4, dtype=torch.float32))


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = Router()
        self.norm = torch.nn.LayerNorm(8)


def float16_module(module: torch.nn.Module) -> torch.nn.Module:
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=8,
        num_attention_heads=1,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
    )
    return Float16Module(cfg, module)


def test_megatron_float16_module_rounds_the_buffers_and_the_fix_restores_float32_before_loading() -> None:
    chunk = float16_module(Layer())
    router = chunk.module.router
    assert router.expert_bias.dtype == torch.bfloat16  # what core_r0.8.0 does to MindSpeed-LLM's buffer
    cast = keep_router_buffers_float32([chunk])
    assert sorted(cast) == ["chunk0:module.router.expert_bias", "chunk0:module.router.local_tokens_per_expert"]
    assert router.expert_bias.dtype == router.local_tokens_per_expert.dtype == torch.float32
    assert router.weight.dtype == torch.bfloat16 and chunk.module.norm.weight.dtype == torch.bfloat16
    exact = torch.tensor([1 + 2**-20, -3e-4, 0.125, 7.0000005])
    state = {k: v.clone() for k, v in chunk.state_dict().items()}
    state["router.expert_bias"] = exact  # Float16Module (de)serialises its inner module
    chunk.load_state_dict(state)
    assert torch.equal(router.expert_bias, exact)  # bf16 would have rounded 1 + 2**-20 to 1
    router.local_tokens_per_expert += 1000.0
    router.local_tokens_per_expert += 1.0
    assert router.local_tokens_per_expert[0].item() == 1001.0  # bf16 counts 1000 + 1 as 1000


def test_float32_models_and_models_without_routers_are_untouched() -> None:
    layer = Layer()
    assert keep_router_buffers_float32([layer]) == []
    plain = torch.nn.Linear(2, 2).bfloat16()
    assert keep_router_buffers_float32([plain]) == []
    assert plain.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("chunks", [2, 3])
def test_every_virtual_pipeline_chunk_is_cast(chunks: int) -> None:
    models = [Layer().bfloat16() for _ in range(chunks)]
    cast = keep_router_buffers_float32(models)
    assert len(cast) == 2 * chunks
    assert all(m.router.expert_bias.dtype == torch.float32 for m in models)
