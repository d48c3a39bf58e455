"""The tiny profile's local assets: deepscaler-format data through our converter, a local tokenizer in
which every `\\boxed{N}` answer is one token, a DeepSeek-V3-shaped model (MLA + MoE) that transformers
loads; built once per spec, rebuilt when the spec changes, nothing downloaded."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl_patches.cpu_proof import tiny_assets
from verl_patches.cpu_proof.tiny_assets import STAMP, TinyAssets, TinySpec, answer_tokens, prepare
from verl_patches.data.rl_rows import DATA_SOURCE, VERL_RL_SCHEMA

SPEC = TinySpec(seed=3, max_operand=4, num_problems=120, train_ratio=0.75)


def mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> TinyAssets:
    return prepare(tmp_path_factory.mktemp("tiny") / "assets", SPEC, progress=False)


def test_raw_data_is_deepscaler_json(built: TinyAssets) -> None:
    rows = json.loads(built.raw_json.read_text())
    assert len(rows) == SPEC.num_problems
    for r in rows:
        assert set(r) == {"problem", "answer", "solution"}
        _, a, b = tiny_assets.parse_problem(SPEC, r["problem"])
        assert 0 <= a <= SPEC.max_operand and 0 <= b <= SPEC.max_operand
        assert r["answer"] == str(a + b) and f"\\boxed{{{a + b}}}" in r["solution"]


def test_parquet_rows_come_from_our_converter(built: TinyAssets) -> None:
    train, val = pq.read_table(built.train_parquet), pq.read_table(built.val_parquet)
    assert train.schema.equals(VERL_RL_SCHEMA) and val.schema.equals(VERL_RL_SCHEMA)
    assert train.num_rows + val.num_rows == SPEC.num_problems  # rows in = rows out
    assert train.num_rows == pytest.approx(SPEC.train_ratio * SPEC.num_problems, abs=1)
    for row in train.to_pylist() + val.to_pylist():
        assert row["data_source"] == DATA_SOURCE and row["ability"] == "math"
        _, a, b = tiny_assets.parse_problem(SPEC, row["extra_info"]["problem"])
        assert row["reward_model"]["ground_truth"] == str(a + b)
        (msg,) = row["prompt"]
        assert msg["role"] == "user" and msg["content"].endswith(row["extra_info"]["problem"])
        assert "<think>" in msg["content"]  # the r1_zero template of our converter
    splits = {r["extra_info"]["split"] for r in train.to_pylist()} | {r["extra_info"]["split"] for r in val.to_pylist()}
    assert splits == {"train", "test"}


@pytest.mark.slow
def test_the_tiny_runs_held_out_problems_are_unseen_texts_of_trained_sums_and_phrasings(tmp_path: Path) -> None:
    """Validation can rise: no held-out text was trained on, yet each held-out sum is trained in another
    phrasing and each held-out phrasing with other sums (the tiny run's own spec)."""
    from verl_patches.cpu_proof.tiny_a3 import tiny_spec
    from verl_patches.trainer.config_compose import compose_config, resolved

    # the split does not depend on the base model: no supervised pass (it needs the overlay's HF router)
    spec = replace(tiny_spec(resolved(compose_config("ppo_tiny_local", []))), base_steps=0)
    assets = prepare(tmp_path / "assets", spec, progress=False)
    train = [r["extra_info"]["problem"] for r in pq.read_table(assets.train_parquet).to_pylist()]
    held = [r["extra_info"]["problem"] for r in pq.read_table(assets.val_parquet).to_pylist()]
    assert len(held) == len(set(held)) >= 8 and not set(held) & set(train)  # each held-out problem once
    parsed_train = [tiny_assets.parse_problem(spec, t) for t in set(train)]
    for text in set(held):
        phrasing, a, b = tiny_assets.parse_problem(spec, text)
        assert any((x, y) == (a, b) and p != phrasing for p, x, y in parsed_train), text
        assert any(p == phrasing and (x, y) != (a, b) for p, x, y in parsed_train), text
    assert len({tiny_assets.parse_problem(spec, t)[0] for t in train}) == len(spec.phrasings)
    tiny_assets.check_learnable_split(assets, spec)


def test_unique_held_out_keeps_one_row_per_problem(tmp_path: Path) -> None:
    spec = TinySpec(seed=3, max_operand=1, num_problems=200, train_ratio=0.7, unique_held_out=True)
    assets = prepare(tmp_path / "assets", spec, progress=False)
    held = [r["extra_info"]["problem"] for r in pq.read_table(assets.val_parquet).to_pylist()]
    assert held and len(held) == len(set(held))
    assert pq.read_table(assets.train_parquet).num_rows + len(held) < spec.num_problems  # copies dropped


def test_a_split_that_holds_out_an_untrained_sum_is_refused() -> None:
    spec = TinySpec(max_operand=1)
    train = ["What is 0 + 0 ?", "Find 0 + 1 ?"]
    tiny_assets.check_held_out(spec, train, ["Find 0 + 0 ?", "What is 0 + 1 ?"])  # both learnable
    with pytest.raises(ValueError, match=r"held-out problem 'What is 1 \+ 1 \?' is not learnable"):
        tiny_assets.check_held_out(spec, train, ["What is 1 + 1 ?"])
    with pytest.raises(ValueError, match="in the training split"):
        tiny_assets.check_held_out(spec, train, ["Find 0 + 1 ?"])
    with pytest.raises(ValueError, match="not learnable"):  # a phrasing never trained
        tiny_assets.check_held_out(spec, train, ["Tell me 0 + 0 ?"])


@pytest.fixture(scope="module")
def tokenizer(built: TinyAssets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(built.model_dir)


def test_every_boxed_answer_is_one_token(tokenizer) -> None:
    answers = answer_tokens(SPEC.max_operand)
    assert answers == [f"\\boxed{{{n}}}" for n in range(2 * SPEC.max_operand + 1)]
    ids = set()
    for ans in answers:
        enc = tokenizer.encode(f"</think> {ans}", add_special_tokens=False)
        assert len(enc) == 2, (ans, tokenizer.convert_ids_to_tokens(enc))
        assert tokenizer.convert_ids_to_tokens(enc[1]) == ans
        ids.add(enc[1])
    assert len(ids) == len(answers)


def test_decode_keeps_the_boxed_answer_gradable(tokenizer) -> None:
    from verl_patches.reward.entry import compute_score

    ids = tokenizer.encode("<think> 3 + 4 </think> \\boxed{7}", add_special_tokens=False)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert "\\boxed{7}" in text and "</think>" in text
    assert tokenizer.unk_token_id not in ids
    score = compute_score("deepscaler", text, "7")
    assert (score["score"] if isinstance(score, dict) else score) == 1


def test_chat_template_renders_prompts_without_unknown_tokens(built: TinyAssets, tokenizer) -> None:
    row = pq.read_table(built.train_parquet).to_pylist()[0]
    text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|user|> ") and text.rstrip().endswith("<|assistant|>")
    assert row["prompt"][0]["content"] in text
    ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.pad_token == "<pad>" and tokenizer.eos_token == "<eos>"


def test_model_is_a_deepseek_v3_with_mla_and_moe(built: TinyAssets, tokenizer) -> None:
    import torch
    from transformers import AutoConfig, DeepseekV3ForCausalLM

    cfg = AutoConfig.from_pretrained(built.model_dir)
    assert cfg.model_type == "deepseek_v3"
    assert cfg.vocab_size == len(tokenizer)
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
    )
    model = DeepseekV3ForCausalLM.from_pretrained(built.model_dir)
    keys = set(model.state_dict())
    last = cfg.num_hidden_layers - 1
    assert last >= cfg.first_k_dense_replace  # at least one MoE layer
    for k in (
        f"model.layers.{last}.mlp.gate.weight",
        f"model.layers.{last}.mlp.experts.0.gate_proj.weight",
        f"model.layers.{last}.mlp.experts.{cfg.n_routed_experts - 1}.down_proj.weight",
        f"model.layers.{last}.mlp.shared_experts.up_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",  # dense first layer
        "model.layers.0.self_attn.q_a_proj.weight",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.kv_a_layernorm.weight",
        "model.layers.0.self_attn.kv_b_proj.weight",
    ):
        assert k in keys, k
    with torch.no_grad():
        out = model(torch.tensor([tokenizer.encode("What is 1 + 2 ?")]))
    assert out.logits.shape[-1] == len(tokenizer) and torch.isfinite(out.logits).all()


def test_second_prepare_rebuilds_nothing(built: TinyAssets) -> None:
    before = mtimes(built.root)
    again = prepare(built.root, SPEC, progress=False)
    assert again == built
    assert mtimes(built.root) == before


def test_changed_spec_rebuilds(tmp_path: Path) -> None:
    root = tmp_path / "assets"
    small = TinySpec(seed=1, max_operand=2, num_problems=40)
    prepare(root, small, progress=False)
    before = mtimes(root)
    bigger = TinySpec(seed=1, max_operand=3, num_problems=40)
    prepare(root, bigger, progress=False)
    after = mtimes(root)
    for f in ("model/config.json", "model/model.safetensors", "model/tokenizer.json", "data/train.parquet", STAMP):
        assert after[f] != before[f], f
    assert json.loads((root / STAMP).read_text())["max_operand"] == 3
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(root / "model")
    assert len(tok.encode("\\boxed{6}", add_special_tokens=False)) == 1  # 3 + 3: only in the new vocabulary


def test_a_failed_rebuild_never_passes_for_the_old_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "assets"
    old = TinySpec(seed=1, max_operand=2, num_problems=40)
    prepare(root, old, progress=False)

    def broken(*_a, **_k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny_assets, "build_model", broken)
    with pytest.raises(RuntimeError):
        prepare(root, TinySpec(seed=2, max_operand=2, num_problems=40), progress=False)
    assert not (root / STAMP).exists()  # data were rewritten for seed 2: no stamp may vouch for them
    monkeypatch.undo()
    prepare(root, old, progress=False)  # rebuilt, consistent again
    from verl_patches.base import cpu_numerics

    assert json.loads((root / STAMP).read_text()) == {**old.as_dict(), "cpu_numerics": cpu_numerics.current()}


def test_assets_built_under_other_cpu_kernels_are_rebuilt(tmp_path, monkeypatch):
    """The base model's floats depend on the CPU code path: the stamp records the pins (cpu_numerics.py)."""
    root = tmp_path / "assets"
    spec = TinySpec(seed=1, max_operand=2, num_problems=40)
    monkeypatch.delenv("MKL_CBWR", raising=False)
    prepare(root, spec, progress=False)
    built = (root / "model" / "config.json").stat().st_mtime_ns
    prepare(root, spec, progress=False)
    assert (root / "model" / "config.json").stat().st_mtime_ns == built  # same settings: reused
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    prepare(root, spec, progress=False)
    assert json.loads((root / STAMP).read_text())["cpu_numerics"]["MKL_CBWR"] == "AVX2"
    assert (root / "model" / "config.json").stat().st_mtime_ns != built


def _greedy_accuracy(model_dir: Path, parquet: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_patches.cpu_proof.tiny_base import supervised_rows

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    rows = supervised_rows(parquet, tok)
    with torch.no_grad():
        hits = [int(model(input_ids=torch.tensor([p])).logits[0, -1].argmax()) == r[0] for p, r in rows]
    return sum(hits) / len(hits)


@pytest.mark.slow
def test_a_base_spec_trains_the_random_model_on_the_training_split_only(tmp_path: Path, monkeypatch) -> None:
    """base_steps > 0: the model that the run starts from answers training problems far above the random
    model, and the pass read the training split and nothing of the held-out one."""
    import pandas as pd

    spec = TinySpec(seed=3, max_operand=1, num_problems=300, train_ratio=0.7, unique_held_out=True)
    random_model = prepare(tmp_path / "random", spec, progress=False)
    read: list[str] = []
    real_read = pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda path, *a, **k: read.append(str(path)) or real_read(path, *a, **k))
    from verl_patches.cpu_proof import tiny_base

    monkeypatch.setattr(tiny_base, "train_base", _recording(tiny_base.train_base, read))
    base = prepare(tmp_path / "base", TinySpec(**{**spec.__dict__, "base_steps": 40}), progress=False)
    during = read[read.index("train_base") : read.index("train_base done")]
    assert during and all(p == str(base.train_parquet) for p in during[1:]), during
    monkeypatch.undo()
    before, after = (_greedy_accuracy(a.model_dir, a.train_parquet) for a in (random_model, base))
    assert after >= 0.5 and after > before + 0.2, (before, after)
    assert json.loads((base.root / STAMP).read_text())["base_steps"] == 40


def _recording(fn, log: list[str]):
    def wrapper(*args, **kwargs):
        log.append("train_base")
        try:
            return fn(*args, **kwargs)
        finally:
            log.append("train_base done")

    return wrapper


def test_a_worked_answer_shows_the_sum_in_think_tags_then_the_boxed_answer(tmp_path: Path) -> None:
    """The strict R1-Zero format (tiny profile): every token of the worked answer is one token of the tokenizer,
    the base model's targets are exactly those tokens and EOS, and the reward grades them as correct."""
    from verl_patches.cpu_proof.tiny_assets import parse_problem, response_tokens
    from verl_patches.cpu_proof.tiny_base import supervised_rows
    from verl_patches.reward.deepscaler import compute_score

    spec = TinySpec(seed=2, max_operand=2, num_problems=30, worked_answer=True)
    assets = prepare(tmp_path / "a", spec, progress=False)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets.model_dir)
    import pandas as pd

    frame = pd.read_parquet(assets.train_parquet)
    rows = supervised_rows(assets.train_parquet, tok, lambda p, a: response_tokens(spec, p, a))
    for (_prompt, target), info, reward in zip(rows, frame["extra_info"], frame["reward_model"]):
        _, a, b = parse_problem(spec, info["problem"])
        answer = str(reward["ground_truth"])
        assert tok.convert_ids_to_tokens(target) == [
            "<think>",
            str(a),
            "+",
            str(b),
            "=",
            answer,
            "</think>",
            f"\\boxed{{{answer}}}",
            "<eos>",
        ]
        text = tok.decode(target, skip_special_tokens=True)
        assert compute_score("deepscaler", text, answer) == 1.0  # strict rule: the answer after </think>
    assert response_tokens(TinySpec(), "What is 1 + 2 ?", "3") == ["\\boxed{3}"]  # the relaxed profile's answer
    with pytest.raises(ValueError, match="not 3"):
        response_tokens(spec, "What is 1 + 2 ?", "4")
