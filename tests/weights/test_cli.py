"""The three weight tools run from the repo root exactly as documented, on the tiny checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "verl_patches" / "scripts"


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, f"verl_patches/scripts/{script}", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_documented_pipeline(fp8_dir, tmp_path):
    bf16, train, mcore, back = (tmp_path / d for d in ("bf16", "DeepSeek-V3", "mcore", "hf"))
    r = run(
        "fp8_cast_bf16.py",
        "--input-fp8-hf-path",
        str(fp8_dir),
        "--output-bf16-hf-path",
        str(bf16),
        "--workers",
        "2",
        "--drop-mtp",
        "--verify",
    )
    assert r.returncode == 0, r.stderr
    assert "verify: OK" in r.stdout and "fp8->bf16" in r.stderr  # progress bar on stderr

    r = run("make_config.py", "--from", str(bf16), "--out", str(train))
    assert r.returncode == 0, r.stderr
    cfg = json.loads((train / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["num_nextn_predict_layers"] == 0
    assert (train / "tokenizer_config.json").is_file()

    flags = [
        "--moe-grouped-gemm",
        "--target-tensor-parallel-size",
        "2",
        "--target-pipeline-parallel-size",
        "2",
        "--num-layer-list",
        "1,3",
        "--target-expert-parallel-size",
        "2",
        "--moe-tp-extend-ep",
        "--first-k-dense-replace",
        "1",
        "--num-layers",
        "4",
    ]
    r = run("convert_ckpt_deepseek3.py", "--load-dir", str(bf16), "--save-dir", str(mcore), "--dry-run", *flags)
    assert r.returncode == 0 and "ranks: 8" in r.stdout and "disk:" in r.stdout and "memory:" in r.stdout, r.stderr
    assert not mcore.exists()
    r = run("convert_ckpt_deepseek3.py", "--load-dir", str(bf16), "--save-dir", str(mcore), "--verify", *flags)
    assert r.returncode == 0, r.stderr
    assert "8 rank(s) written" in r.stdout and "verify: OK" in r.stdout
    assert (mcore / "iter_0000001" / "mp_rank_01_001_001" / "model_optim_rng.pt").is_file()
    r = run("convert_ckpt_deepseek3.py", "--load-dir", str(bf16), "--save-dir", str(mcore), *flags)
    assert r.returncode == 0 and "0 rank(s) written, 8 already done" in r.stdout

    r = run(
        "convert_ckpt_deepseek3.py",
        "--reverse",
        "--load-dir",
        str(mcore),
        "--save-dir",
        str(back),
        "--tokenizer-dir",
        str(train),
        "--verify",
    )
    assert r.returncode == 0, r.stderr
    assert "verify: OK" in r.stdout and (back / "tokenizer_config.json").is_file()


@pytest.mark.parametrize(
    "script,args,fragment",
    [
        ("convert_ckpt_deepseek3.py", ["--num-layer-list", "1,x"], "--num-layer-list '1,x': items must be integers"),
        (
            "convert_ckpt_deepseek3.py",
            ["--target-pipeline-parallel-size", "2", "--num-layer-list", "2,1"],
            "--num-layer-list 2,1 sums to 3, not num_layers=4",
        ),
        ("convert_ckpt_deepseek3.py", ["--noop-layers", "3"], "--noop-layers is not supported"),
        ("convert_ckpt_deepseek3.py", ["--reverse"], "no conversion_manifest.json; give the layout flags"),
    ],
)
def test_bad_input_is_one_line_without_traceback(script, args, fragment, hf_dir, tmp_path):
    r = run(script, "--load-dir", str(hf_dir), "--save-dir", str(tmp_path / "o"), *args)
    assert r.returncode == 2, r.stdout
    assert fragment in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_fp8_cast_bad_source_is_one_line(hf_dir, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(hf_dir, src)
    idx = json.loads((src / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.layers.0.mlp.up_proj.weight_scale_inv"] = "model-00001-of-00003.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(idx))
    r = run("fp8_cast_bf16.py", "--input-fp8-hf-path", str(src), "--output-bf16-hf-path", str(tmp_path / "o"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
    assert "'model.layers.0.mlp.up_proj.weight_scale_inv' listed in the index is not in this shard" in r.stderr


@pytest.mark.parametrize("script", ["make_config.py", "fp8_cast_bf16.py", "convert_ckpt_deepseek3.py"])
def test_help(script):
    r = run(script, "--help")
    assert r.returncode == 0 and "usage:" in r.stdout
