"""G3, G4, G5, G8, G9, G11 without a process group: the shims make verl's mcore package import on
core_r0.8.0, and the pure parts (NPU flash-attention mask, registry entries, HF-vs-arguments check,
override handling) behave as documented. Each runs in a fresh interpreter where the overlay is active,
so nothing here depends on import order in the test process."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from verl_patches.patches.verl.models.config_converter import (
    ConfigMismatchError,
    UnknownOverrideError,
    apply_overrides,
    hf_arg_mismatches,
)
from verl_patches.patches.verl.models.model_forward import npu_fa_mask
from verl_patches.patches.verl.models.registry_entries import with_deepseek_v3

REPO = Path(__file__).resolve().parents[2]


def run_fresh(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# ---- G11: the mask npu_fusion_attention takes -------------------------------------------------------


def reference_mask(valid: list[int]) -> torch.Tensor:
    s = len(valid)
    m = torch.ones(s, s, dtype=torch.bool)
    for i, j in itertools.product(range(s), range(s)):
        if j <= i and valid[i] and valid[j]:
            m[i, j] = False
    return m


@pytest.mark.parametrize("s", [1, 2, 3, 5])
def test_npu_fa_mask_is_causal_and_masks_padding_everywhere(s: int) -> None:
    rows = list(itertools.product([0, 1], repeat=s))  # every padding pattern of length s
    mask = torch.tensor(rows)
    got = npu_fa_mask(mask)
    assert got.shape == (len(rows), 1, s, s) and got.dtype == torch.bool
    for b, valid in enumerate(rows):
        assert torch.equal(got[b, 0], reference_mask(list(valid))), valid


def test_npu_fa_mask_accepts_bool_and_int() -> None:
    m = torch.tensor([[1, 1, 0]])
    assert torch.equal(npu_fa_mask(m), npu_fa_mask(m.bool()))


# ---- G8: config checks ------------------------------------------------------------------------------


def test_hf_arg_mismatches_name_both_sides() -> None:
    hf = SimpleNamespace(
        num_hidden_layers=61, hidden_size=7168, n_routed_experts=256, rms_norm_eps=1e-6, q_lora_rank=1536
    )
    args = SimpleNamespace(num_layers=61, hidden_size=7168, num_experts=128, norm_epsilon=1e-6, q_lora_rank=None)
    out = hf_arg_mismatches(hf, args)
    assert out == ["model config n_routed_experts=256 but Megatron argument num_experts=128"]
    assert hf_arg_mismatches(hf, SimpleNamespace(num_layers=61, norm_epsilon=1e-6 * (1 + 1e-15))) == []


def test_overrides_apply_and_unknown_key_is_named() -> None:
    from dataclasses import dataclass

    @dataclass
    class Cfg:
        recompute_granularity: str | None = None
        num_layers: int = 2

    c = apply_overrides(Cfg(), {"recompute_granularity": "full"}, "override_transformer_config")
    assert c.recompute_granularity == "full"
    with pytest.raises(UnknownOverrideError, match=r"override_transformer_config\.num_layers_in_first_pipeline_stage"):
        apply_overrides(Cfg(), {"num_layers_in_first_pipeline_stage": 3}, "override_transformer_config")
    assert issubclass(ConfigMismatchError, ValueError)


# ---- registries --------------------------------------------------------------------------------------


def test_with_deepseek_v3_replaces_exactly_one_entry() -> None:
    import enum

    class M(enum.Enum):
        A = "LlamaForCausalLM"
        D = "DeepseekV3ForCausalLM"

    orig = {M.A: 1, M.D: 2}
    new = with_deepseek_v3(orig, 3)
    assert new == {M.A: 1, M.D: 3} and orig[M.D] == 2
    with pytest.raises(KeyError, match="0 entries"):
        with_deepseek_v3({M.A: 1}, 3)


@pytest.mark.slow
def test_verl_mcore_imports_and_registries_point_at_ours() -> None:
    out = run_fresh("""
        import verl_patches.prelude_patch
        import dataclasses
        from verl.models.mcore import registry as r
        from verl.models.mcore.config_converter import MLATransformerConfig
        from verl.models.mcore.model_initializer import DeepseekV3Model
        from megatron.core.packed_seq_params import PackedSeqParams
        import verl.models.mcore.util as util
        ds = [k for k in r.SupportedModel if k.value == "DeepseekV3ForCausalLM"][0]
        print(r.MODEL_CONFIG_CONVERTER_REGISTRY[ds].__module__)
        print(r.MODEL_INITIALIZER_REGISTRY[ds].__module__)
        print(r.MODEL_FORWARD_REGISTRY[ds].__module__)
        print(r.get_mcore_forward_fn(type("C", (), {"architectures": ["DeepseekV3ForCausalLM"]})()).__module__)
        p = util.PackedSeqParams(qkv_format="thd", cu_seqlens_q_padded=1, cu_seqlens_kv_padded=2)
        print(p.cu_seqlens_kv_padded, util.PackedSeqParams is PackedSeqParams)
        names = [f.name for f in dataclasses.fields(MLATransformerConfig)]
        print(sorted(n for n in names if n in ("q_lora_rank", "v_head_dim")))
        print(r.get_mcore_forward_fn(type("C", (), {"architectures": ["LlamaForCausalLM"]})()).__module__)
    """).split()
    ours = "verl_patches.patches.verl.models."
    assert out[:4] == [
        ours + "config_converter",
        ours + "model_initializer",
        ours + "model_forward",
        ours + "model_forward",
    ]
    assert out[4:6] == ["2", "True"]
    assert out[6:8] == ["['q_lora_rank',", "'v_head_dim']"]
    assert out[-1] == "verl.models.mcore.model_forward"  # other families keep upstream's


@pytest.mark.slow
def test_spec_shims_say_what_is_unsupported() -> None:
    out = run_fresh("""
        import verl_patches.prelude_patch
        from megatron.core.models.gpt import gpt_layer_specs as s
        for fn in (s.get_gpt_decoder_block_spec, s.get_gpt_mtp_block_spec):
            try:
                fn(None, use_transformer_engine=True)
            except NotImplementedError as e:
                print(e)
    """)
    assert "only DeepseekV3ForCausalLM is supported" in out
    assert "num_nextn_predict_layers to 0" in out


def test_initializer_returns_no_rope_args_and_refuses_a_value_model() -> None:
    from verl_patches.patches.verl.models.model_initializer import DeepseekV3Model

    init = DeepseekV3Model(tfconfig=None, hf_config=None)
    assert init.get_rope_scaling_args() == {}
    with pytest.raises(NotImplementedError, match="value model"):
        init.initialize(value=True)
