"""check_logprobs against hostile and careless inputs (issue 27): its inputs are checked before any work
(tokenizer present and loadable, sizes bounded, floating-point tensors of the model's schema), the exit status
is 0 pass / 1 mismatch / 2 bad input or any failure, and the ranks' result files are read weights-only."""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from verl_patches.checks import cli, run
from verl_patches.checks.inputs import CheckRequestError, check_inputs
from verl_patches.checks.run import CheckResult

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    from tests.megatron_engine.golden_assets import build_hf_model

    return build_hf_model(tmp_path_factory.mktemp("hf"))


@pytest.fixture
def hf(tiny_hf, tmp_path) -> Path:
    d = tmp_path / "hf"
    shutil.copytree(tiny_hf, d)
    return d


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the check starts any work (memory estimate, conversion, reference, ranks)."""

    def must_not_run(*a, **k):
        raise AssertionError("work started before the inputs were checked")

    monkeypatch.setattr(run, "check_memory", must_not_run)
    monkeypatch.setattr(run, "prepare_models", must_not_run)


def _main_error(capsys, *argv: str) -> str:
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    return line


def _rewrite_tensor(hf: Path, name: str, edit) -> None:
    (shard,) = hf.glob("*.safetensors")
    tensors = load_file(str(shard))
    tensors[name] = edit(tensors[name])
    save_file(tensors, str(shard), metadata={"format": "pt"})


# ---- inputs checked before any work --------------------------------------------------------------------------


def test_a_missing_tokenizer_is_refused_before_any_work(hf, capsys, no_work):
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"):
        (hf / f).unlink(missing_ok=True)
    line = _main_error(capsys, "--hf", str(hf))
    assert f"--hf {hf}: no tokenizer" in line


def test_a_tokenizer_that_does_not_load_is_refused_before_any_work(hf, capsys, no_work):
    (hf / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    line = _main_error(capsys, "--hf", str(hf))
    assert "the tokenizer does not load" in line


@pytest.mark.parametrize(
    "key,value",
    [("hidden_size", 2**31), ("n_routed_experts", 10**6), ("vocab_size", 2**40), ("num_hidden_layers", 10**5)],
)
def test_implausible_sizes_are_refused_naming_the_key(hf, capsys, no_work, key, value):
    cfg = json.loads((hf / "config.json").read_text())
    cfg[key] = value
    (hf / "config.json").write_text(json.dumps(cfg))
    line = _main_error(capsys, "--hf", str(hf), "--layers", "1")
    assert f"key {key!r}" in line and "beyond any model" in line


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_non_floating_weights_are_refused_naming_the_tensor(hf, capsys, no_work, dtype):
    name = "model.layers.0.self_attn.o_proj.weight"
    _rewrite_tensor(hf, name, lambda t: t.to(dtype))
    for extra in ([], ["--dtype", "float32"]):
        line = _main_error(capsys, "--hf", str(hf), *extra)
        assert repr(name) in line and str(dtype) in line


def test_a_tensor_outside_the_schema_is_refused(hf, capsys, no_work):
    (shard,) = hf.glob("*.safetensors")
    tensors = load_file(str(shard))
    tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    line = _main_error(capsys, "--hf", str(hf))
    assert "'model.layers.0.self_attn.o_proj.bias' is not part of the DeepSeek-V3 model" in line


def test_a_bad_megatron_tracker_is_refused_before_any_work(hf, tmp_path, capsys, no_work):
    mcore = tmp_path / "mcore"
    mcore.mkdir()
    (mcore / "latest_checkpointed_iteration.txt").write_text("²")
    line = _main_error(capsys, "--hf", str(hf), "--mcore", str(mcore))
    assert "latest_checkpointed_iteration.txt" in line


def test_the_inputs_of_a_good_model_pass(hf):
    cfg = check_inputs(hf, None)
    assert cfg["hidden_size"] == 64
    with pytest.raises(CheckRequestError, match="not a folder"):
        check_inputs(hf / "config.json", None)


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--tp", "²"),
        ("--tokens", "1" * 5000),
        ("--tolerance", "nan"),
        ("--tolerance", "inf"),
        ("--timeout", "-1"),
        ("--layers", "0"),
        ("--num-layer-list", "1,x"),
    ],
)
def test_bad_flags_are_usage_errors(capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        cli.main(["--hf", "/m", flag, value])
    assert e.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err.splitlines()[-1]


# ---- exit status: 0 pass, 1 mismatch, 2 bad input or failure ------------------------------------------------


@pytest.mark.parametrize("outcome,status", [("pass", 0), ("mismatch", 1), ("crash", 2), ("weights", 2)])
def test_exit_status_separates_mismatch_from_failure(hf, monkeypatch, capsys, outcome, status):
    from verl_patches.weights.errors import CheckpointError

    def fake(req, log, work_dir):
        if outcome == "crash":
            raise RuntimeError("boom\nsecond line")
        if outcome == "weights":
            raise CheckpointError("x.pt: corrupt")
        return CheckResult(outcome == "pass", [f"result: {outcome}"])

    monkeypatch.setattr(cli, "run_check", fake)
    assert cli.main(["--hf", str(hf)]) == status
    err = capsys.readouterr().err
    if status == 2:
        (line,) = [ln for ln in err.splitlines() if ln.strip()]
        assert "Traceback" not in err and ("boom" in line or "corrupt" in line)


# ---- result files are read weights-only ---------------------------------------------------------------------


class _Pwn:
    def __reduce__(self):
        return (os.system, (f"touch {_Pwn.marker}",))


def test_a_tampered_rank_result_is_refused_unread(tmp_path):
    _Pwn.marker = tmp_path / "pwned"
    out = tmp_path / "out"
    out.mkdir()
    torch.save(torch.zeros(2, 3), out / "megatron_dp0.pt")
    with open(out / "rollout.pt", "wb") as f:
        pickle.dump(_Pwn(), f)
    req = run.CheckRequest(hf=tmp_path)
    with pytest.raises(Exception) as e:
        run.collect(req, out, 1)
    assert "rollout.pt" in str(e.value) and not _Pwn.marker.exists()
    torch.save(torch.ones(2, 3), out / "rollout.pt")
    got = run.collect(req, out, 1)
    assert torch.equal(got["rollout"], torch.ones(2, 3)) and got["megatron"].shape == (2, 3)


def test_no_bare_torch_load_in_the_check():
    for path in sorted((ROOT / "verl_patches" / "checks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                kws = {k.arg: ast.unparse(k.value) for k in node.keywords}
                assert kws.get("weights_only") == "True", f"{path.name}:{node.lineno}"
