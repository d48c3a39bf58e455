"""check_logprobs end to end on a tiny DeepSeek-V3 (MLA, 1 dense + 2 MoE layers, 8 routed experts, shared
expert, non-zero routing bias): verl's Megatron worker on MindSpeed over gloo and the rollout stand-in after
the A3 weight sync, against HF transformers.

- agreement at EP2 (2 ranks, HF converted by the check, truncated to 2 layers / 4 experts) and at PP2 with the
  uneven layer list [1, 2] (2 ranks, a given --mcore checkpoint, full model, rollout EP1: every rank serves
  every expert);
- a Megatron checkpoint converted from a different HF checkpoint fails, naming megatron and the worst token;
- a Megatron checkpoint with one expert's weights changed fails for both engines (read through the --layers/
  --experts slice of the Megatron checkpoint).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl_patches.checks.cli import main

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.needs_components("mindspeed", "mindspeed_llm"),
]
AGREE_TOL = 1e-4  # fp32 everywhere: measured 2.4e-7 (megatron) and 0 (rollout)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from tests.megatron_engine.golden_assets import build_hf_model

    root = tmp_path_factory.mktemp("check_models")
    return {"hf": build_hf_model(root / "a", seed=0), "other": build_hf_model(root / "b", seed=11)}


def _convert(hf: Path, out: Path, **layout) -> Path:
    from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore
    from verl_patches.weights.layout import ParallelLayout

    convert_hf_to_mcore(hf, out, ParallelLayout(moe_grouped_gemm=True, moe_tp_extend_ep=True, **layout), progress=False)
    return out


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["--timeout", "900", "--tokens", "12", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def _report(text: str, engine: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{engine}: max |diff| "))
    return float(line.split("max |diff| ")[1].split(",")[0])


def test_agreement_at_ep2_with_truncation(models, capsys):
    code, text = _run(
        capsys, "--hf", str(models["hf"]), "--ep", "2", "--layers", "2", "--experts", "4", "--tolerance", str(AGREE_TOL)
    )
    print(text)
    assert code == 0, text
    assert _report(text, "megatron") < AGREE_TOL and _report(text, "rollout") < AGREE_TOL
    assert "PASS" in text


def test_agreement_at_pp2_uneven_from_a_given_megatron_checkpoint(models, tmp_path, capsys):
    mcore = _convert(models["hf"], tmp_path / "mcore", pp=2, num_layer_list=(1, 2))
    code, text = _run(
        capsys,
        "--hf",
        str(models["hf"]),
        "--mcore",
        str(mcore),
        "--pp",
        "2",
        "--num-layer-list",
        "1,2",
        "--moe-tp-extend-ep",
        "--rollout-ep",
        "1",
        "--tolerance",
        str(AGREE_TOL),
    )
    print(text)
    assert code == 0, text
    assert _report(text, "megatron") < AGREE_TOL and _report(text, "rollout") < AGREE_TOL


def test_checkpoint_converted_from_another_model_fails_naming_megatron(models, tmp_path, capsys):
    mcore = _convert(models["other"], tmp_path / "mcore", ep=2)
    code, text = _run(capsys, "--hf", str(models["hf"]), "--mcore", str(mcore), "--ep", "2", "--engines", "megatron")
    print(text)
    assert code == 1, text
    fail = [ln for ln in text.splitlines() if ln.startswith("FAIL ")]
    assert len(fail) == 1 and fail[0].startswith("FAIL megatron: max |diff| ") and "token position" in fail[0]
    assert _report(text, "megatron") > 1e-2


def test_one_changed_expert_fails_for_both_engines(models, tmp_path, capsys):
    from verl_patches.weights.hf_to_mcore import rank_file
    from verl_patches.weights.layout import ParallelLayout, Rank

    mcore = _convert(models["hf"], tmp_path / "mcore", ep=2)
    layout = ParallelLayout(ep=2, moe_grouped_gemm=True, moe_tp_extend_ep=True)
    # expert 1 of layer 1 (the first MoE layer) lives on EP rank 0 (experts 0-3): its gate/up columns in weight1
    path = rank_file(mcore, layout, Rank(0, 0, 0))
    obj = torch.load(path, weights_only=False)
    w1 = obj["model"]["decoder.layers.1.mlp.experts.weight1"]
    h, f2 = 64, 2 * 32
    w1.view(4, h, f2)[1].add_(0.5)
    torch.save(obj, path)
    code, text = _run(
        capsys, "--hf", str(models["hf"]), "--mcore", str(mcore), "--ep", "2", "--layers", "3", "--experts", "4"
    )
    assert code == 2 and "sha256" in text and "differs" in text, text  # the converter's digest: refused unread
    import hashlib
    import json

    man = json.loads((mcore / "conversion_manifest.json").read_text())  # rewritten too: the engines must see it
    man["ranks"][path.parent.name]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    man["ranks"][path.parent.name]["size"] = path.stat().st_size
    (mcore / "conversion_manifest.json").write_text(json.dumps(man))
    code, text = _run(
        capsys, "--hf", str(models["hf"]), "--mcore", str(mcore), "--ep", "2", "--layers", "3", "--experts", "4"
    )
    print(text)
    assert code == 1, text
    fails = {ln.split(":")[0] for ln in text.splitlines() if ln.startswith("FAIL ")}
    assert fails == {"FAIL megatron", "FAIL rollout"}, text
