"""check_logprobs.py's arguments: requests that cannot be checked stop with exit status 2 and one line naming
the flag, before any model is read or any rank started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verl_patches.checks.cli import build_parser, main, request_from_args
from verl_patches.checks.run import CheckRequest, CheckRequestError, validate_request

ROOT = Path(__file__).resolve().parents[2]


def test_arguments_become_a_request():
    ns = build_parser().parse_args(
        [
            "--hf",
            "/m",
            "--mcore",
            "/c",
            "--tp",
            "2",
            "--pp",
            "2",
            "--ep",
            "2",
            "--num-layer-list",
            "1,2",
            "--moe-tp-extend-ep",
            "--engines",
            "megatron",
            "--tokens",
            "9",
            "--seed",
            "4",
            "--layers",
            "3",
            "--experts",
            "16",
            "--rollout-tp",
            "2",
            "--rollout-ep",
            "4",
            "--tolerance",
            "0.01",
        ]
    )
    req = request_from_args(ns)
    assert req == CheckRequest(
        hf=Path("/m"),
        mcore=Path("/c"),
        tp=2,
        pp=2,
        ep=2,
        num_layer_list=(1, 2),
        moe_tp_extend_ep=True,
        engines=("megatron",),
        tokens=9,
        seed=4,
        layers=3,
        experts=16,
        rollout_tp=2,
        rollout_ep=4,
        tolerance=0.01,
        timeout_s=1800.0,
        dtype="auto",
    )
    assert req.world == 8 and req.dp == 2
    validate_request(req)


def test_default_dtype_is_the_checkpoints_and_the_tolerance_follows_it():
    import torch

    from verl_patches.checks.run import default_tolerance, engine_dtype

    req = request_from_args(build_parser().parse_args(["--hf", "/m"]))
    assert req.dtype == "auto" and req.tolerance is None
    assert engine_dtype(req, torch.bfloat16) == "bfloat16" and engine_dtype(req, torch.float32) == "float32"
    with pytest.raises(CheckRequestError, match="--dtype auto: /m stores its weights as torch.float16"):
        engine_dtype(req, torch.float16)
    forced = request_from_args(build_parser().parse_args(["--hf", "/m", "--dtype", "float32"]))
    assert engine_dtype(forced, torch.bfloat16) == "float32"
    assert default_tolerance("float32") == 1e-3 and default_tolerance("bfloat16") == 0.15


@pytest.mark.parametrize(
    "kw,flag",
    [
        (dict(rollout_ep=3, ep=2), "--rollout-ep 3"),
        (dict(rollout_tp=2, rollout_ep=1), "--rollout-tp 2"),
        (dict(tp=0), "--tp"),
        (dict(num_layer_list=(1, 2)), "--num-layer-list"),
        (dict(engines=("vllm",)), "--engines"),
        (dict(tolerance=0.0), "--tolerance"),
        (dict(tokens=0), "--tokens"),
    ],
)
def test_invalid_requests_name_the_flag(kw, flag):
    with pytest.raises(CheckRequestError, match=flag):
        validate_request(CheckRequest(hf=Path("/m"), **kw))


def test_unusable_request_exits_2_before_reading_anything(tmp_path, capsys):
    assert main(["--hf", str(tmp_path / "absent"), "--ep", "2", "--rollout-ep", "3"]) == 2
    assert "--rollout-ep 3" in capsys.readouterr().err


def test_missing_model_folder_exits_2_naming_it(tmp_path, capsys):
    assert main(["--hf", str(tmp_path / "absent"), "--layers", "1"]) == 2
    assert str(tmp_path / "absent") in capsys.readouterr().err


def test_script_runs_as_a_file():
    out = subprocess.run(
        [sys.executable, str(ROOT / "verl_patches/scripts/check_logprobs.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert out.returncode == 0 and "--experts" in out.stdout and "--rollout-ep" in out.stdout


def test_megatron_checkpoint_of_another_layout_exits_2_naming_both(tmp_path, capsys):
    from tests.megatron_engine.golden_assets import build_hf_model
    from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore
    from verl_patches.weights.layout import ParallelLayout

    hf = build_hf_model(tmp_path)
    mcore = tmp_path / "mcore"
    convert_hf_to_mcore(hf, mcore, ParallelLayout(ep=2, moe_grouped_gemm=True, moe_tp_extend_ep=True), progress=False)
    assert main(["--hf", str(hf), "--mcore", str(mcore), "--ep", "1", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(mcore) in err and "'ep': 2" in err and "'ep': 1" in err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("check_logprobs_")]  # temp folder removed
