"""Everything the tiny local run needs, built on this machine: data, tokenizer, model. Nothing is downloaded.

The task is single-digit addition in deepscaler format, converted by our own json_to_parquet and graded
by our own reward, so the local run exercises the same data and reward code as the cluster job. Each
possible answer `\\boxed{N}` is one token of the tokenizer. With `TinySpec.worked_answer` (the tiny profile, whose
reward keeps the A3 profiles' strict R1-Zero rule) a response shows its working inside think tags first,
`<think> a + b = N </think> \\boxed{N}`: nine tokens with EOS, so most of a rollout's tokens come from decode
steps, as on A3, and the reward grades the answer after `</think>` as it does there.
The model is randomly initialised, then (`TinySpec.base_steps`, tiny_base.py) given a short supervised pass
over the training split: RL starts from a weak base, as R1-Zero does, and the mean reward and validation rise
as it learns the sums.

Every sum is asked in several phrasings, and the converter's split keeps each distinct problem text on
one side: the held-out split is problems the model never trained on, made of operands and words it did
see (each held-out sum is trained in other phrasings, each phrasing with other sums), so validation
measures whether it learnt the sums rather than the training texts, and rises as it does.
`check_learnable_split` refuses assets where that does not hold (the tiny run calls it; small specs built
by tests need not satisfy it).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_patches.base import cpu_numerics
from verl_patches.base.atomic_write import write_text_atomically
from verl_patches.cpu_proof import tiny_base
from verl_patches.weights.config import make_tiny_config

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|user|>", "<|assistant|>"]
THINK_TOKENS = ["<think>", "</think>"]
# How a sum is asked: different openings, the same ending, so a held-out text differs from trained ones of the
# same sum only where a small model can learn to look past (the digits sit at the same distance from
# the answer in every phrasing); every word is in the training split (see the module docstring). Thirty
# openings: with sums up to 2 + 2 that is 270 texts, and a fifth held out gives validation 54 problems
OPENINGS = (
    "What is",
    "Tell me",
    "Quick :",
    "Now ,",
    "Please compute",
    "Find",
    "Compute",
    "Give",
    "Solve",
    "Calculate",
    "Add",
    "Work out",
    "Evaluate",
    "Say",
    "Answer",
    "Try",
    "Do",
    "Determine",
    "Figure out",
    "Get",
    "Show",
    "Sum",
    "Total of",
    "Result of",
    "Value of",
    "Hey ,",
    "Okay ,",
    "So ,",
    "Next ,",
    "Then ,",
)
PHRASINGS = tuple(f"{opening} {{a}} + {{b}} ?" for opening in OPENINGS)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
STAMP = "tiny_assets.json"


@dataclass(frozen=True)
class TinySpec:
    """What the tiny profile builds; the stamp file records it so a changed spec rebuilds."""

    seed: int = 1
    max_operand: int = 4  # a, b in [0, max_operand]: answers 0..2*max_operand
    num_problems: int = 2000
    train_ratio: float = 0.9
    template: str = "r1_zero"
    model_overrides: tuple[tuple[str, Any], ...] = ()
    # each MoE layer's score-correction bias (e_score_correction_bias, noaux_tc) drawn from N(mean, std^2), seeded;
    # both 0: transformers' zeros
    router_bias_mean: float = 0.0
    router_bias_std: float = 0.0
    vocab_multiple: int = 1  # the model's vocabulary padded to a multiple (Megatron's TP/EP splits need it)
    phrasings: tuple[str, ...] = PHRASINGS
    # one held-out row per distinct problem: validation decodes greedily (n=1), so copies add time, not
    # information, and verl's val-core metric would score only the most repeated problem
    unique_held_out: bool = False
    # supervised steps over the training split that turn the random model into a weak base (tiny_base.py);
    # 0: RL starts from the random model (the tiny profile sets 100, overlay.tiny_base_steps)
    base_steps: int = 0
    # the base model answers `<think> a + b = N </think> \boxed{N}` (the strict R1-Zero format) instead of
    # `\boxed{N}` alone (tiny_a3 sets it from the reward's format rule)
    worked_answer: bool = False

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["model_overrides"] = dict(self.model_overrides)
        d["phrasings"] = list(self.phrasings)  # as JSON reads it back (the stamp comparison)
        return d


@dataclass(frozen=True)
class TinyAssets:
    root: Path
    model_dir: Path  # HF config + safetensors + tokenizer: the actor_rollout_ref.model.path
    train_parquet: Path
    val_parquet: Path
    raw_json: Path


def answer_tokens(max_operand: int) -> list[str]:
    return [f"\\boxed{{{n}}}" for n in range(2 * max_operand + 1)]


def problem_text(phrasing: str, a: int, b: int) -> str:
    return phrasing.format(a=a, b=b)


WORKING_WORDS = ("+", "=")  # the words of a worked answer besides digits and the added tokens


def response_tokens(spec: TinySpec, problem: str, answer: str) -> list[str]:
    """The tokens of the base model's response to `problem` (EOS not included): the boxed answer, after its
    working in think tags when `spec.worked_answer`."""
    boxed = f"\\boxed{{{answer}}}"
    if not spec.worked_answer:
        return [boxed]
    _, a, b = parse_problem(spec, problem)
    if a + b != int(answer):
        raise ValueError(f"tiny assets: problem {problem!r} has answer {answer!r}, not {a + b}")
    return [THINK_TOKENS[0], *str(a), "+", *str(b), "=", *answer, THINK_TOKENS[1], boxed]


def write_arithmetic_json(path: Path, spec: TinySpec) -> Path:
    """A deepscaler-format JSON array of `a+b` problems (problem, answer, solution), each in a random phrasing."""
    rng = random.Random(spec.seed)
    rows = []
    for _ in range(spec.num_problems):
        a, b = rng.randint(0, spec.max_operand), rng.randint(0, spec.max_operand)
        phrasing = spec.phrasings[rng.randrange(len(spec.phrasings))]
        rows.append(
            {
                "problem": problem_text(phrasing, a, b),
                "answer": str(a + b),
                "solution": f"{a} + {b} = {a + b}, so the answer is \\boxed{{{a + b}}}.",
            }
        )
    write_text_atomically(path, json.dumps(rows))
    return path


def build_tokenizer(out_dir: Path, texts: list[str], max_operand: int) -> Any:
    """A word-level tokenizer over the words of `texts`, digits one by one, with a chat template."""
    # lazy: tokenizers is heavy and only this path needs it; importing this module stays light
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # lazy: transformers is heavy and only this path needs it; importing this module stays light
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation("isolated"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    words = sorted({w for t in texts for w, _ in pre.pre_tokenize_str(t)} | set("0123456789") | set(WORKING_WORDS))
    added = THINK_TOKENS + answer_tokens(max_operand)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + added + [w for w in words if w not in added])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    tok.add_tokens(added)  # matched before pre-tokenization, so `\boxed{7}` stays one token
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out_dir)
    return tok


def build_model(
    out_dir: Path,
    vocab_size: int,
    seed: int,
    tokenizer: Any,
    overrides: dict[str, Any] | None = None,
    router_bias: tuple[float, float] = (0.0, 0.0),
) -> Path:
    """A randomly initialised DeepSeek-V3-shaped model (MLA + MoE) from our tiny config generator; each MoE
    layer's score-correction bias drawn from N(mean, std^2) for `router_bias` = (mean, std)."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    # lazy: transformers is heavy and only this path needs it; importing this module stays light
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, GenerationConfig

    cfg = make_tiny_config(vocab_size=vocab_size, **(overrides or {}))
    cfg.update(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg))
    mean, std = router_bias
    if mean or std:
        draw = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in model.model.layers[cfg["first_k_dense_replace"] :]:
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(mean + std * torch.randn(bias.shape, generator=draw))
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def require_deepseek_routing(spec: TinySpec) -> None:
    """Refuse to train a base model with a score-correction bias unless transformers' router in this process
    masks unselected groups as DeepSeek-V3 does (-inf, the declared transformers patch), as the Megatron
    router and the rollout kernel that take the model over do; with a zero bias every biased score is a
    sigmoid, positive, and HF's 0.0 mask chooses the same experts."""
    if not (spec.router_bias_mean or spec.router_bias_std):
        return
    # lazy: the patches layer loads torch and transformers; asked only before a base pass with a bias
    from verl_patches.patches.transformers.deepseek_v3_router import hf_routes_as_deepseek

    if not hf_routes_as_deepseek():
        raise RuntimeError(
            "tiny assets: the base model's supervised pass would route with transformers' 0.0 group mask "
            "(its router bias makes biased scores negative); activate the overlay first "
            "(import verl_patches.prelude_patch), as the trainer entry does"
        )


def keep_one_row_per_problem(parquet: Path) -> None:
    """Rewrite `parquet` (atomically) with the first row of each distinct problem, in order."""
    # lazy: pyarrow is heavy and only this path needs it; importing this module stays light
    import pyarrow as pa
    import pyarrow.parquet as pq

    # lazy: that module loads pyarrow; importing this one must not
    from verl_patches.data.parquet_io import write_tables_atomically

    table = pq.read_table(parquet)
    seen: set[str] = set()
    rows = []
    for i, info in enumerate(table.column("extra_info").to_pylist()):
        if info["problem"] not in seen:
            seen.add(info["problem"])
            rows.append(i)
    write_tables_atomically({parquet: table.take(pa.array(rows))}, overwrite=True)


def check_learnable_split(assets: TinyAssets, spec: TinySpec) -> None:
    """`check_held_out` on the built parquet files."""
    # lazy: pandas is heavy and only this path needs it; importing this module stays light
    import pandas as pd

    check_held_out(
        spec,
        [row["problem"] for row in pd.read_parquet(assets.train_parquet)["extra_info"]],
        [row["problem"] for row in pd.read_parquet(assets.val_parquet)["extra_info"]],
    )


def parse_problem(spec: TinySpec, text: str) -> tuple[str, int, int]:
    """(phrasing, a, b) of a generated problem text."""
    for phrasing in spec.phrasings:
        for a in range(spec.max_operand + 1):
            for b in range(spec.max_operand + 1):
                if problem_text(phrasing, a, b) == text:
                    return phrasing, a, b
    raise ValueError(f"tiny assets: {text!r} is not a generated problem")


def check_held_out(spec: TinySpec, train: list[str], held_out: list[str]) -> None:
    """Every held-out problem is unseen as a text, its sum is trained in another phrasing and its phrasing
    with other sums; raises one line naming the first problem for which that fails."""
    seen = set(train)
    trained = [parse_problem(spec, t) for t in seen]
    sums, phrasings = {(a, b) for _, a, b in trained}, {p for p, _, _ in trained}
    for text in dict.fromkeys(held_out):
        phrasing, a, b = parse_problem(spec, text)
        if text in seen or (a, b) not in sums or phrasing not in phrasings:
            raise ValueError(
                f"tiny assets (seed {spec.seed}): held-out problem {text!r} is "
                f"{'in the training split' if text in seen else 'not learnable from the training split'}"
                f"; choose another overlay.tiny_seed"
            )


def prepare(root: Path, spec: TinySpec = TinySpec(), progress: bool = True) -> TinyAssets:
    """Build (or reuse, if built with the same spec) the data, tokenizer and model under `root`."""
    # lazy: pandas is heavy and only this path needs it; importing this module stays light
    import pandas as pd

    # lazy: that module loads pyarrow, tqdm; importing this one must not
    from verl_patches.data.convert import convert

    root = Path(root)
    assets = TinyAssets(
        root=root,
        model_dir=root / "model",
        train_parquet=root / "data" / "train.parquet",
        val_parquet=root / "data" / "test.parquet",
        raw_json=root / "raw" / "arithmetic.json",
    )
    stamp = root / STAMP

    recorded = {**spec.as_dict(), "cpu_numerics": cpu_numerics.current()}  # the base model depends on both
    if (
        stamp.exists()
        and json.loads(stamp.read_text()) == recorded
        and assets.train_parquet.exists()
        and (assets.model_dir / "config.json").exists()
    ):
        return assets
    # The stamp goes first: a rebuild that fails half-way must not leave the old spec's stamp beside a mix
    # of new and old files (a later call with the old spec would take them as complete).
    stamp.unlink(missing_ok=True)
    write_arithmetic_json(assets.raw_json, spec)
    convert(
        assets.raw_json,
        assets.train_parquet.parent,
        train_ratio=spec.train_ratio,
        seed=spec.seed,
        template=spec.template,
        progress=progress,
        overwrite=True,
    )  # rebuilding its own assets
    if spec.unique_held_out:
        keep_one_row_per_problem(assets.val_parquet)
    prompts = [
        m["content"]
        for p in (assets.train_parquet, assets.val_parquet)
        for msgs in pd.read_parquet(p)["prompt"]
        for m in msgs
    ]
    assets.model_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(assets.model_dir, prompts, spec.max_operand)
    vocab = -(-len(tok) // spec.vocab_multiple) * spec.vocab_multiple
    build_model(
        assets.model_dir,
        vocab,
        spec.seed,
        tok,
        dict(spec.model_overrides),
        router_bias=(spec.router_bias_mean, spec.router_bias_std),
    )
    if spec.base_steps:
        require_deepseek_routing(spec)
        tiny_base.train_base(
            assets.model_dir,
            assets.train_parquet,
            spec.base_steps,
            spec.seed,
            response=lambda problem, answer: response_tokens(spec, problem, answer),
        )
    write_text_atomically(stamp, json.dumps(recorded, indent=2))
    return assets


def prepare_megatron(assets: TinyAssets, out_dir: Path, layout: Any, progress: bool = True) -> Path:
    """The tiny model in our converter's Megatron layout (`layout`: a weights.layout.ParallelLayout), the
    weights the Megatron actor and reference load; rebuilt when the model or the layout changes."""
    # lazy: that module loads safetensors, torch, tqdm; importing this one must not
    from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore

    out_dir = Path(out_dir)
    key = {"layout": layout.to_json(), "model": json.loads((assets.root / STAMP).read_text())}
    stamp = out_dir / "tiny_mcore.json"
    if stamp.exists() and json.loads(stamp.read_text()) == key:
        return out_dir
    stamp.unlink(missing_ok=True)
    convert_hf_to_mcore(assets.model_dir, out_dir, layout, overwrite=True, progress=progress)
    write_text_atomically(stamp, json.dumps(key, indent=2))
    return out_dir
