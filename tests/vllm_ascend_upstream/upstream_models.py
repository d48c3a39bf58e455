"""Small models built on this machine under the Hugging Face names vllm-ascend's tests hard-code.

Upstream's tests name their models (`facebook/opt-125m`, `Qwen/Qwen2.5-0.5B-Instruct`, `deepseek-ai/DeepSeek-V2-Lite`)
and have no option for a path. Nothing is downloaded at test time here, so the names are resolved the way
huggingface_hub resolves any name offline: a hub cache folder (HF_HUB_CACHE, with HF_HUB_OFFLINE=1) holding, under
each name, a model of the same architecture built here: a few layers, random weights (fixed seed), a byte-level
tokenizer (any text tokenizes, nothing is unknown). What a test checks with it is what the emulation must get right
for any weights: the engine starts, schedules, caches and decodes, and the same inputs give the same tokens twice;
no test here judges a model's quality. The cache lives in a temporary folder of the test session, never in the
user's hub cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED = 0
EOS = "<|endoftext|>"


def byte_tokenizer(out_dir: Path) -> Any:
    """A byte-level BPE tokenizer without merges: 256 byte tokens plus one special end-of-text token."""
    # lazy: tokenizers and transformers are heavy; importing this module stays light
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab[EOS] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=EOS, eos_token=EOS, pad_token=EOS, unk_token=EOS)
    tok.save_pretrained(out_dir)
    return tok


def _save(model: Any, tok: Any, out_dir: Path) -> None:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out_dir, safe_serialization=True)


def _random_model(
    out_dir: Path, config_class: Any, model_class: Any, dtype: str, special: tuple[str, ...], **dims: Any
) -> None:
    """A ``model_class`` of 2 layers of width 128 with 2 query heads (``dims`` adds to or replaces these), over the
    byte tokenizer (its end-of-text token as each ``special`` token id of the config), random weights (SEED) in
    ``dtype``, saved with the tokenizer."""
    import torch

    tok = byte_tokenizer(out_dir)
    shape = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=2048)
    ids = {f"{role}_token_id": getattr(tok, f"{role}_token_id") for role in special}
    cfg = config_class(vocab_size=len(tok), torch_dtype=dtype, **ids, **{**shape, **dims})
    torch.manual_seed(SEED)
    _save(model_class(cfg).to(getattr(torch, dtype)), tok, out_dir)


def opt_model(out_dir: Path) -> None:
    """OPTForCausalLM (the architecture of facebook/opt-125m), float16, 2 layers of width 128."""
    from transformers import OPTConfig, OPTForCausalLM

    special = ("bos", "eos", "pad")
    _random_model(out_dir, OPTConfig, OPTForCausalLM, "float16", special, word_embed_proj_dim=128, ffn_dim=256)


def qwen2_model(out_dir: Path) -> None:
    """Qwen2ForCausalLM (the architecture of Qwen/Qwen2.5-0.5B-Instruct), bfloat16, 2 layers of width 128, head
    size 64 as there, grouped-query attention (2 query heads per key head), tied embeddings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    grouped = dict(intermediate_size=256, num_key_value_heads=1, tie_word_embeddings=True)
    _random_model(out_dir, Qwen2Config, Qwen2ForCausalLM, "bfloat16", ("bos", "eos"), **grouped)


def deepseek_model(out_dir: Path) -> None:
    """The project's tiny DeepSeek-V3-shaped model (MLA + MoE; verl_patches.cpu_proof.tiny_assets, the model of the tiny
    run): the A3 model's architecture, and the closest to DeepSeek-V2-Lite's that transformers ships without remote
    code."""
    from verl_patches.cpu_proof.tiny_assets import build_model

    tok = byte_tokenizer(out_dir)
    build_model(out_dir, vocab_size=len(tok), seed=SEED, tokenizer=tok)


# the names upstream's selected tests load -> how this machine builds a model of that architecture
BUILDERS: dict[str, Callable[[Path], None]] = {
    "facebook/opt-125m": opt_model,
    "Qwen/Qwen2.5-0.5B-Instruct": qwen2_model,
    "deepseek-ai/DeepSeek-V2-Lite": deepseek_model,
}


def _fingerprint(folder: Path) -> str:
    digest = hashlib.sha1()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f.relative_to(folder).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def build_hub_cache(root: Path, names: list[str] | None = None) -> Path:
    """A hub cache folder at `root` holding a locally built model under each name (all of BUILDERS by default):
    `models--<org>--<name>/snapshots/<revision>/` with `refs/main` naming the revision, as huggingface_hub lays
    out what it downloaded. Returns `root` (the value of HF_HUB_CACHE)."""
    root = Path(root)
    for name in names or list(BUILDERS):
        org, _, model = name.partition("/")
        repo = root / f"models--{org}--{model}"
        staging = repo / "staging"
        BUILDERS[name](staging)
        revision = _fingerprint(staging)
        snapshot = repo / "snapshots" / revision
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(snapshot)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    (root / "built_by.json").write_text(json.dumps({"builder": __name__, "models": sorted(names or BUILDERS)}))
    return root
