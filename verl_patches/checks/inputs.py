"""What `check_logprobs` needs from its model folders, checked before any work (no conversion, no rank).

A missing tokenizer used to surface inside a rank after the conversion, a config with ``hidden_size`` 2^31 as
an overflow in the memory estimate, int32 weights as a traceback in the reference model. Here: the config is
validated (bounded sizes, `weights.config`), every tensor of ``--hf`` is one the DeepSeek-V3 schema of that
config names and floating point (float32, bfloat16 or float16; FP8 needs fp8_cast_bf16.py first), the
tokenizer is present and loads with transformers, and ``--mcore`` has a readable tracker and manifest.
Every refusal is a `CheckRequestError` (or a `WeightsError`) of one line naming the folder, file or tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_patches.weights.config import load_config
from verl_patches.weights.manifest_file import read_conversion_manifest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


class CheckRequestError(ValueError):
    """A request that cannot be run; the message names the flag (and the file or tensor)."""


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return (lines[0] if lines else type(err).__name__)[:200]


def check_hf_tensors(hf: Path, cfg: Mapping[str, Any]) -> None:
    """Every tensor of the HF folder is in the model's schema, every schema tensor is there, all floating."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    # lazy: that module loads torch; importing this one must not
    from verl_patches.weights.hf_schema import hf_tensor_specs

    # lazy: that module loads safetensors, torch, tqdm; importing this one must not
    from verl_patches.weights.hf_to_mcore import unconverted_hint

    # lazy: that module loads safetensors, torch; importing this one must not
    from verl_patches.weights.st_reader import CheckpointIndex, read_header

    index = CheckpointIndex.load(hf)
    schema = {s.name for s in hf_tensor_specs(cfg)}
    for fname in index.files():
        header = read_header(index.root / fname)
        for name, (dtype, _) in header.items():
            if name not in index.weight_map:
                continue
            if dtype == torch.float8_e4m3fn:
                raise CheckRequestError(
                    f"--hf {index.root / fname}: tensor {name!r} is FP8; convert the checkpoint "
                    f"with fp8_cast_bf16.py first"
                )
            if str(dtype).removeprefix("torch.") not in FLOAT_DTYPES:
                raise CheckRequestError(
                    f"--hf {index.root / fname}: tensor {name!r} is {dtype}; the check compares "
                    f"models with {', '.join(FLOAT_DTYPES)} weights"
                )
    unknown = sorted(n for n in index.weight_map if n not in schema)
    if unknown:
        raise CheckRequestError(
            f"--hf {hf}: tensor {unknown[0]!r} is not part of the DeepSeek-V3 model its "
            f"config.json describes ({unconverted_hint(unknown[0], cfg)}); "
            f"{len(unknown)} such tensor(s)"
        )
    missing = sorted(schema - set(index.weight_map))
    if missing:
        raise CheckRequestError(
            f"--hf {hf}: tensor {missing[0]!r} of the model is not in the checkpoint ({len(missing)} missing)"
        )


def check_tokenizer(hf: Path) -> None:
    """The tokenizer every engine's worker loads (transformers' AutoTokenizer, no remote code) loads here."""
    if not any((hf / f).is_file() for f in TOKENIZER_FILES):
        raise CheckRequestError(
            f"--hf {hf}: no tokenizer ({', '.join(TOKENIZER_FILES)}); copy the model's tokenizer files into it"
        )
    try:
        # lazy: transformers is heavy and only this path needs it; importing this module stays light
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(hf), trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - a broken tokenizer raises many types; one line names it
        raise CheckRequestError(
            f"--hf {hf}: the tokenizer does not load ({type(err).__name__}: {_first_line(err)})"
        ) from None


def check_mcore(mcore: Path) -> None:
    """A Megatron folder with a strictly readable tracker and (when present) conversion manifest."""
    # lazy: that module loads safetensors, torch, tqdm; importing this one must not
    from verl_patches.weights.hf_to_mcore import MANIFEST_FILE
    from verl_patches.weights.mcore_to_hf import read_tracker

    if not mcore.is_dir():
        raise CheckRequestError(f"--mcore {mcore}: not a folder")
    read_tracker(mcore)
    read_conversion_manifest(mcore, MANIFEST_FILE)


def check_inputs(hf: Path, mcore: Path | None) -> dict[str, Any]:
    """Check the folders (see the module docstring); returns --hf's validated config."""

    if not Path(hf).is_dir():
        raise CheckRequestError(f"--hf {hf}: not a folder (the HF model: config.json, safetensors, tokenizer)")
    cfg = load_config(hf)
    check_hf_tensors(Path(hf), cfg)
    check_tokenizer(Path(hf))
    if mcore is not None:
        check_mcore(Path(mcore))
    return cfg
