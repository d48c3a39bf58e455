"""vLLM V1 in float32 on a CPU host (declared patch vllm.engine.arg_utils.v1_oracle.fp32_on_cpu): upstream
refuses the dtype, the patched oracle decides float32 as bf16 and every other rule as upstream does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def npu_platform(monkeypatch) -> None:
    """The oracle reads the platform vLLM resolved once per process: in a test process where vLLM was first
    used before its plugins were discoverable that is vLLM's unspecified platform. Here it is vllm-ascend's,
    as in every rollout process (tests/rollout/test_platform_discovery.py)."""
    import vllm.platforms as platforms
    from vllm_ascend.platform import NPUPlatform

    monkeypatch.setattr(platforms, "_current_platform", NPUPlatform())


def _oracle_and_config(model_dir: Path, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, **kwargs)
    return args, args.create_model_config()


def test_upstream_refuses_float32_and_the_patch_lets_it_through(tiny_model_dir: Path, monkeypatch) -> None:
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("VLLM_USE_V1", "1")
    patched = EngineArgs._is_v1_supported_oracle
    original = getattr(patched, "__wrapped__", None)
    assert original is not None, "the fp32 oracle patch is not applied in this CPU process"
    args, cfg = _oracle_and_config(tiny_model_dir, dtype="float32")
    assert cfg.dtype == torch.float32
    with pytest.raises(NotImplementedError, match="float32"):
        original(args, cfg)
    assert patched(args, cfg) is True
    assert cfg.dtype == torch.float32  # shown as bf16 to the original only during the call


def test_every_other_v1_rule_still_decides(tiny_model_dir: Path, monkeypatch) -> None:
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("VLLM_USE_V1", "1")
    args, cfg = _oracle_and_config(tiny_model_dir, dtype="float32")
    cfg.task = "embed"  # V1 0.9.1 generates only: refused by the original, not by the dtype rule
    with pytest.raises(NotImplementedError, match="--task"):
        EngineArgs._is_v1_supported_oracle(args, cfg)
    assert cfg.dtype == torch.float32


def test_a_failing_original_still_restores_the_dtype(tiny_model_dir: Path) -> None:
    from verl_patches.patches.vllm.engine.fp32_on_cpu import wrap_v1_oracle

    _, cfg = _oracle_and_config(tiny_model_dir, dtype="float32")
    seen = []

    def refusing(self, model_config):
        seen.append(model_config.dtype)
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        wrap_v1_oracle(refusing)(None, cfg)
    assert seen == [torch.bfloat16] and cfg.dtype == torch.float32
