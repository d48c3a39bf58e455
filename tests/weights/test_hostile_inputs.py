"""Hostile and careless inputs to the weight tools (issue 27): tools delete only what they wrote, no tensor is
silently dropped or turned non-finite, trackers/iterations/manifests are parsed strictly, every refusal is one
line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from verl_patches.base.atomic_write import atomic_path
from verl_patches.weights.dequant import dequantize_fp8_blockwise
from verl_patches.weights.errors import CheckpointError, ManifestError, ResumeError, VerifyError
from verl_patches.weights.fp8_cast import SCALE_SUFFIX, run_fp8_cast
from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore
from verl_patches.weights.layout import ParallelLayout
from verl_patches.weights.manifest_file import is_shard_file_name, read_conversion_manifest
from verl_patches.weights.mcore_to_hf import convert_mcore_to_hf
from verl_patches.weights.resume import plan_output
from verl_patches.weights.st_reader import CheckpointIndex
from verl_patches.weights.st_writer import TensorSpec, write_safetensors_file
from verl_patches.weights.verify import verify_hf_mcore_pair

REPO = Path(__file__).resolve().parents[2]
INDEX = "model.safetensors.index.json"
TP2 = ParallelLayout(tp=2, moe_grouped_gemm=True)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


def _rewrite(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    with atomic_path(path) as tmp:
        write_safetensors_file(
            tmp, [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()], lambda s: tensors[s.name]
        )


def _edit_tensor(root: Path, name: str, edit) -> None:
    fname = CheckpointIndex.load(root).weight_map[name]
    tensors = load_file(str(root / fname))
    tensors[name] = edit(tensors[name].clone())
    _rewrite(root / fname, tensors)


def _add_tensor(root: Path, name: str, t: torch.Tensor) -> None:
    index = json.loads((root / INDEX).read_text())
    fname = sorted(set(index["weight_map"].values()))[0]
    tensors = load_file(str(root / fname))
    tensors[name] = t
    _rewrite(root / fname, tensors)
    index["weight_map"][name] = fname
    (root / INDEX).write_text(json.dumps(index))


@pytest.fixture(scope="module")
def mcore_dir(tmp_path_factory, hf_dir) -> Path:
    d = tmp_path_factory.mktemp("mcore") / "tp2"
    convert_hf_to_mcore(hf_dir, d, TP2, progress=False)
    return d


def _another_model(folder: Path) -> dict[str, bytes]:
    """A folder holding someone else's model (shards, index, config) and no manifest of ours."""
    folder.mkdir(parents=True)
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"their weights 1")
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"their weights 2")
    (folder / INDEX).write_text('{"weight_map": {}}')
    (folder / "config.json").write_text("{}")
    return _tree(folder)


# ---- 2. tools delete only what they wrote ----------------------------------------------------------------


# the tools that write an HF model folder, each with the fixture of the checkpoint it reads
HF_WRITERS = {
    "fp8_cast": ("fp8_dir", lambda src, out, overwrite: run_fp8_cast(src, out, overwrite=overwrite, progress=False)),
    "export": (
        "mcore_dir",
        lambda src, out, overwrite: convert_mcore_to_hf(src, out, overwrite=overwrite, progress=False),
    ),
}


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("tool", HF_WRITERS)
def test_hf_writers_refuse_a_folder_of_another_model_with_or_without_overwrite(request, tmp_path, tool, overwrite):
    checkpoint, write = HF_WRITERS[tool]
    out = tmp_path / "other"
    before = _another_model(out)
    with pytest.raises(ResumeError) as e:
        write(request.getfixturevalue(checkpoint), out, overwrite)
    msg = _one_line(e.value)
    assert "did not write" in msg and "--overwrite" not in msg and str(out) in msg
    assert _tree(out) == before


@pytest.mark.parametrize("overwrite", [False, True])
def test_hf_to_mcore_refuses_foreign_rank_folders_with_or_without_overwrite(hf_dir, tmp_path, overwrite):
    out = tmp_path / "ckpt"
    (out / "iter_0000001" / "mp_rank_05").mkdir(parents=True)
    (out / "iter_0000001" / "mp_rank_05" / "model_optim_rng.pt").write_bytes(b"someone's training run")
    before = _tree(out)
    with pytest.raises(ResumeError) as e:
        convert_hf_to_mcore(hf_dir, out, TP2, overwrite=overwrite, progress=False)
    assert "--overwrite" not in _one_line(e.value)
    assert _tree(out) == before


def test_overwrite_removes_only_the_files_our_earlier_export_manifest_lists(mcore_dir, tmp_path):
    out = tmp_path / "export"
    first = convert_mcore_to_hf(mcore_dir, out, max_shard_bytes=200_000, progress=False)
    old_shards = set(first.written)
    assert len(old_shards) > 2
    (out / "notes.txt").write_text("the user's notes")
    (out / "zzz-mine.safetensors").write_bytes(b"not listed in the manifest")
    second = convert_mcore_to_hf(mcore_dir, out, max_shard_bytes=10**9, overwrite=True, progress=False)
    assert len(second.written) == 1
    names = {p.name for p in out.iterdir()}
    assert (out / "notes.txt").read_text() == "the user's notes"
    assert (out / "zzz-mine.safetensors").read_bytes() == b"not listed in the manifest"
    assert not (old_shards - set(second.written)) & names  # our earlier shards are gone
    assert set(CheckpointIndex.load(out).files()) == set(second.written)


def test_overwrite_of_another_layout_removes_only_listed_rank_files(hf_dir, tmp_path):
    out = tmp_path / "ckpt"
    convert_hf_to_mcore(hf_dir, out, ParallelLayout(tp=2, ep=2, moe_grouped_gemm=True), progress=False)
    keep = out / "iter_0000001" / "mp_rank_00_001" / "user-notes.txt"
    keep.write_text("mine")
    convert_hf_to_mcore(hf_dir, out, TP2, overwrite=True, progress=False)
    ranks = sorted(p.name for p in (out / "iter_0000001").iterdir())
    assert ranks == ["mp_rank_00", "mp_rank_00_001", "mp_rank_01"]  # the folder with a foreign file stays
    assert keep.read_text() == "mine" and not (keep.parent / "model_optim_rng.pt").exists()


@pytest.mark.parametrize(
    "listed", ["../victim.safetensors", "/tmp/victim.safetensors", ".hidden.safetensors", "a/b.safetensors"]
)
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_manifest_cannot_point_a_deletion_outside_its_folder(mcore_dir, tmp_path, listed, overwrite):
    out = tmp_path / "box" / "export"
    convert_mcore_to_hf(mcore_dir, out, progress=False)
    victim = tmp_path / "box" / "victim.safetensors"
    victim.write_bytes(b"precious")
    man = json.loads((out / "export_manifest.json").read_text())
    man["shards"][listed] = {"size": 8, "sha256": "0" * 64, "tensors": 1}
    (out / "export_manifest.json").write_text(json.dumps(man))
    with pytest.raises(ResumeError) as e:
        convert_mcore_to_hf(mcore_dir, out, overwrite=overwrite, max_shard_bytes=100_000, progress=False)
    assert "shards." in _one_line(e.value) and "--overwrite" not in str(e.value)
    assert victim.read_bytes() == b"precious"


def test_a_manifest_of_another_tool_is_not_ours(fp8_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "fp8_cast_manifest.json").write_text(json.dumps({"tool": "someone.else", "shards": {}}))
    (out / "model-00001-of-00004.safetensors").write_bytes(b"x")
    with pytest.raises(ResumeError, match="not by verl_patches.weights.fp8_cast") as e:
        run_fp8_cast(fp8_dir, out, overwrite=True, progress=False)
    assert "--overwrite" not in _one_line(e.value)
    assert (out / "model-00001-of-00004.safetensors").read_bytes() == b"x"


def test_our_own_leftover_temp_files_do_not_make_a_folder_foreign(fp8_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".verl_patches-tmp-0123456789abcdef.fp8_cast_manifest.json").write_text(
        "{"
    )  # a run killed before its first manifest
    rep = run_fp8_cast(fp8_dir, out, progress=False)
    assert len(rep.written) == 4 and not list(out.glob(".verl_patches-tmp-*"))


# ---- 3. no silently wrong weights --------------------------------------------------------------------------


def test_a_tensor_outside_the_schema_is_refused_by_name(hf_dir, tmp_path):
    src = shutil.copytree(hf_dir, tmp_path / "src")
    _add_tensor(src, "model.layers.0.self_attn.o_proj.bias", torch.zeros(160, dtype=torch.bfloat16))
    with pytest.raises(CheckpointError) as e:
        convert_hf_to_mcore(src, tmp_path / "out", TP2, progress=False)
    assert "'model.layers.0.self_attn.o_proj.bias'" in _one_line(e.value) and "would drop it" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_an_mtp_layer_left_in_a_bf16_checkpoint_is_refused_with_the_fix(fp8_dir, tmp_path):
    bf16 = tmp_path / "bf16"
    run_fp8_cast(fp8_dir, bf16, progress=False)  # without --drop-mtp: layer 4 is the MTP layer
    with pytest.raises(CheckpointError, match=r"model\.layers\.4\..*--drop-mtp"):
        convert_hf_to_mcore(bf16, tmp_path / "out", TP2, progress=False)


def test_verify_counts_the_input_tensors(hf_dir, mcore_dir, tiny_cfg, tmp_path):
    rep = verify_hf_mcore_pair(hf_dir, mcore_dir, TP2, tiny_cfg, progress=False)
    assert rep.hf_tensors == rep.input_tensors == len(CheckpointIndex.load(hf_dir).weight_map)
    src = shutil.copytree(hf_dir, tmp_path / "src")
    _add_tensor(src, "model.layers.0.self_attn.o_proj.bias", torch.zeros(160, dtype=torch.bfloat16))
    with pytest.raises(VerifyError, match=r"'model\.layers\.0\.self_attn\.o_proj\.bias'.*no counterpart") as e:
        verify_hf_mcore_pair(src, mcore_dir, TP2, tiny_cfg, progress=False)
    _one_line(e.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_fp8_scale_is_refused_by_name_without_verify(fp8_dir, tmp_path, value):
    src = shutil.copytree(fp8_dir, tmp_path / "src")
    weight = "model.layers.2.self_attn.o_proj.weight"

    def poison(s):
        s[0, 0] = value
        return s

    _edit_tensor(src, weight + SCALE_SUFFIX, poison)
    with pytest.raises(CheckpointError) as e:
        run_fp8_cast(src, tmp_path / "out", progress=False)
    assert repr(weight) in _one_line(e.value) and "non-finite" in str(e.value)
    assert not (tmp_path / "out" / INDEX).exists()


def test_a_scale_that_would_overflow_bfloat16_is_refused(fp8_dir, tmp_path):
    src = shutil.copytree(fp8_dir, tmp_path / "src")
    weight = "model.layers.1.self_attn.kv_b_proj.weight"
    _edit_tensor(src, weight + SCALE_SUFFIX, lambda s: s.fill_(3e38))
    with pytest.raises(CheckpointError, match=r"kv_b_proj\.weight'.*3e\+38 .*outside the plausible range"):
        run_fp8_cast(src, tmp_path / "out", progress=False)


def test_a_non_finite_tensor_copied_as_is_is_refused(fp8_dir, tmp_path):
    src = shutil.copytree(fp8_dir, tmp_path / "src")
    name = "model.layers.1.input_layernorm.weight"

    def poison(t):
        t[7] = float("nan")
        return t

    _edit_tensor(src, name, poison)
    with pytest.raises(CheckpointError, match=rf"'{name}' holds a non-finite value \(nan\) at \(7,\)"):
        run_fp8_cast(src, tmp_path / "out", progress=False)


def test_dequantize_refuses_non_finite_scales_and_results():
    w = torch.full((4, 4), 2.0).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"non-finite value \(nan\) at block \(0, 0\)"):
        dequantize_fp8_blockwise(w, torch.tensor([[float("nan")]]))
    with pytest.raises(ValueError, match="outside the plausible range"):
        dequantize_fp8_blockwise(w, torch.tensor([[3e38]]))
    assert torch.equal(dequantize_fp8_blockwise(w, torch.tensor([[0.5]])), torch.ones(4, 4, dtype=torch.bfloat16))


# ---- 4. strict trackers, iterations and manifests -------------------------------------------------------------


@pytest.mark.parametrize("content", ["²".encode(), b"1" * 5000, b"\xff\xfe1", b"12 13", b"-1", b"0x10"])
def test_export_refuses_a_bad_tracker_in_one_line(mcore_dir, tmp_path, content):
    ck = shutil.copytree(mcore_dir, tmp_path / "ck")
    (ck / "latest_checkpointed_iteration.txt").write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        convert_mcore_to_hf(ck, tmp_path / "out", progress=False)
    assert "latest_checkpointed_iteration.txt" in _one_line(e.value) and len(str(e.value)) < 400
    assert not (tmp_path / "out").exists()


def test_a_symlinked_tracker_is_refused_without_echoing_its_target(mcore_dir, tmp_path):
    ck = shutil.copytree(mcore_dir, tmp_path / "ck")
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    (ck / "latest_checkpointed_iteration.txt").unlink()
    os.symlink(secret, ck / "latest_checkpointed_iteration.txt")
    with pytest.raises(CheckpointError) as e:
        convert_mcore_to_hf(ck, tmp_path / "out", progress=False)
    assert "symbolic link" in _one_line(e.value) and "hunter2" not in str(e.value)


def _run_tool(script: str, *args: str) -> subprocess.CompletedProcess:
    """A weight tool, verl_patches/scripts/`script`, run from the repo root as a user runs it."""
    return subprocess.run(
        [sys.executable, f"verl_patches/scripts/{script}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return _run_tool("convert_ckpt_deepseek3.py", *args)


@pytest.mark.parametrize("it", ["²", "1" * 5000, "-1", " 1", "1_0", "١"])
def test_cli_iteration_is_strict(mcore_dir, tmp_path, it):
    r = _run_cli("--reverse", "--load-dir", str(mcore_dir), "--save-dir", str(tmp_path / "o"), "--iteration", it)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "--iteration" in line and len(line) < 300
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--target-tensor-parallel-size", "²"),
        ("--workers", "0"),
        ("--target-expert-parallel-size", "1" * 5000),
        ("--max-shard-size-gb", "nan"),
    ],
)
def test_cli_integers_and_sizes_are_strict(hf_dir, tmp_path, flag, value):
    r = _run_cli("--load-dir", str(hf_dir), "--save-dir", str(tmp_path / "o"), flag, value)
    assert r.returncode == 2 and "Traceback" not in r.stderr and f"argument {flag}" in r.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "edit,key",
    [
        (lambda m: m["layout"].update(tp="2"), "layout.tp"),
        (lambda m: m["layout"].update(tp=10**12), "layout.tp"),
        (lambda m: m["layout"].update(moe_grouped_gemm="yes"), "layout.moe_grouped_gemm"),
        (lambda m: m.update(hf_config=[1]), "hf_config"),
        (lambda m: m["ranks"].update({"../../etc": {"size": 1, "sha256": "0" * 64}}), "ranks.../../etc"),
        (lambda m: m["ranks"]["mp_rank_00"].update(sha256="zz"), "ranks.mp_rank_00.sha256"),
        (lambda m: m.update(tool="rm -rf"), "tool"),
    ],
)
def test_a_tampered_conversion_manifest_is_one_line_naming_the_key(mcore_dir, tmp_path, edit, key):
    ck = shutil.copytree(mcore_dir, tmp_path / "ck")
    man = json.loads((ck / "conversion_manifest.json").read_text())
    edit(man)
    (ck / "conversion_manifest.json").write_text(json.dumps(man))
    with pytest.raises(ManifestError) as e:
        read_conversion_manifest(ck)
    assert f"key {key!r}" in _one_line(e.value)
    with pytest.raises(CheckpointError):  # the export reads it through the same parser
        convert_mcore_to_hf(ck, tmp_path / "out", progress=False)


def test_a_manifest_that_is_a_fifo_or_a_link_is_refused_without_blocking(mcore_dir, tmp_path):
    ck = shutil.copytree(mcore_dir, tmp_path / "ck")
    (ck / "conversion_manifest.json").unlink()
    os.mkfifo(ck / "conversion_manifest.json")
    with pytest.raises(ManifestError, match="FIFO"):
        read_conversion_manifest(ck)
    (ck / "conversion_manifest.json").unlink()
    os.symlink("/etc/passwd", ck / "conversion_manifest.json")
    with pytest.raises(ManifestError, match="symbolic link"):
        read_conversion_manifest(ck)


# ---- 8. property: the manifest parsers against arbitrary bytes ----------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_layouts = st.fixed_dictionaries(
    {
        "tp": _json_values | st.integers(-3, 5),
        "pp": st.integers(-1, 4),
        "ep": st.integers(0, 4),
        "num_layer_list": _json_values,
        "moe_grouped_gemm": _json_values,
        "moe_tp_extend_ep": st.booleans(),
    }
)
_names = st.sampled_from(
    [
        "mp_rank_00",
        "mp_rank_01_002",
        "../x",
        "/abs",
        "mp_rank_00/../..",
        ".hidden",
        "model-00001-of-00002.safetensors",
        "a/b.safetensors",
        "..",
        "x\x00y",
    ]
) | st.text(max_size=12)
_entries = st.dictionaries(
    _names,
    st.fixed_dictionaries({"size": _json_values | st.integers(-1, 10), "sha256": st.just("a" * 64) | _json_values}),
    max_size=3,
)
_manifests = st.fixed_dictionaries(
    {
        "tool": st.sampled_from(["verl_patches.weights.hf_to_mcore", "verl_patches.checkpoint", "x"]) | _json_values,
        "layout": _layouts | _json_values,
        "hf_config": _json_values,
        "complete": _json_values | st.booleans(),
        "ranks": _entries | _json_values,
        "shards": _entries,
        "files": st.lists(_names, max_size=3) | _json_values,
    }
)
_manifest_bytes = (
    st.binary(max_size=300)
    | _manifests.map(lambda m: json.dumps(m).encode())
    | st.builds(lambda m, cut: json.dumps(m).encode()[:cut], _manifests, st.integers(0, 200))
)


def _confined(name: str) -> bool:
    return "/" not in name and name not in ("", ".", "..") and not name.startswith(".") and "\x00" not in name


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_manifest_bytes)
def test_property_conversion_manifest_parser_never_crashes_nor_names_a_path_outside(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("m")
    (folder / "conversion_manifest.json").write_bytes(data)
    try:
        man = read_conversion_manifest(folder)
    except ManifestError as e:
        _one_line(e)
        return
    assert man is not None and man.layout.tp * man.layout.pp * man.layout.ep <= 1 << 16
    assert all(_confined(n) and n.startswith("mp_rank_") for n in man.ranks)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_manifest_bytes, overwrite=st.booleans())
def test_property_output_plan_never_crashes_nor_lists_a_path_outside(tmp_path_factory, data, overwrite):
    folder = tmp_path_factory.mktemp("o")
    (folder / "export_manifest.json").write_bytes(data)
    key = {"tool": "verl_patches.weights.mcore_to_hf", "version": 1}
    try:
        plan = plan_output(folder, key, overwrite, "shards", "export_manifest.json", is_shard_file_name, "shard file")
    except ResumeError as e:
        _one_line(e)
        return
    for man in (plan.manifest, plan.previous or {}):
        assert all(_confined(n) for n in man.get("shards", {})) and all(_confined(n) for n in man.get("files", []))


def test_outputs_follow_the_umask(fp8_dir, tmp_path):
    old = os.umask(0o022)
    try:
        run_fp8_cast(fp8_dir, tmp_path / "out", progress=False)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes


@pytest.mark.parametrize(
    "value,words",
    [("9" * 5000, "not a config value"), ("2147483648", "beyond any model"), ("[" * 100000, "not a config value")],
)
def test_make_config_set_values_are_one_line(tmp_path, value, words):
    r = _run_tool("make_config.py", "--out", str(tmp_path / "o"), "--set", f"hidden_size={value}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert words in line and "hidden_size" in line


def test_other_fp8_formats_and_non_float_scales_are_refused_by_name(fp8_dir, tmp_path):
    src = shutil.copytree(fp8_dir, tmp_path / "src")
    name = "model.layers.1.input_layernorm.weight"
    _edit_tensor(src, name, lambda t: t.to(torch.float8_e5m2))
    with pytest.raises(CheckpointError, match=rf"'{name}' is torch.float8_e5m2"):
        run_fp8_cast(src, tmp_path / "out", progress=False)
    src2 = shutil.copytree(fp8_dir, tmp_path / "src2")
    scale = "model.layers.2.self_attn.o_proj.weight" + SCALE_SUFFIX
    _edit_tensor(src2, scale, lambda s: s.to(torch.int32))
    with pytest.raises(CheckpointError, match=rf"scale '{scale}' is torch.int32"):
        run_fp8_cast(src2, tmp_path / "out2", progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_a_non_float_hf_tensor_is_refused_by_name(hf_dir, tmp_path):
    src = shutil.copytree(hf_dir, tmp_path / "src")
    name = "model.layers.0.self_attn.o_proj.weight"
    _edit_tensor(src, name, lambda t: t.to(torch.int32))
    with pytest.raises(CheckpointError, match=rf"'{name}' is torch.int32"):
        convert_hf_to_mcore(src, tmp_path / "out", TP2, progress=False)


def test_overwrite_never_follows_a_planted_link_out_of_the_folder(hf_dir, tmp_path):
    out = tmp_path / "ckpt"
    layout = ParallelLayout(tp=2, ep=2, moe_grouped_gemm=True)
    convert_hf_to_mcore(hf_dir, out, layout, progress=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model_optim_rng.pt").write_bytes(b"precious")
    victim_rank = out / "iter_0000001" / "mp_rank_01_001"
    shutil.rmtree(victim_rank)
    os.symlink(elsewhere, victim_rank)  # listed in our manifest, now a link out of the folder
    convert_hf_to_mcore(hf_dir, out, TP2, overwrite=True, progress=False)
    assert (elsewhere / "model_optim_rng.pt").read_bytes() == b"precious"


def _retamper_rank_file(folder: Path) -> Path:
    """One rank file of a converted folder rewritten by a plain torch.save: a valid file, other values."""
    path = sorted(folder.rglob("model_optim_rng.pt"))[0]
    obj = torch.load(path, weights_only=False)  # noqa: S614 - our own converter's file, read to alter it
    key = next(k for k, v in obj["model"].items() if isinstance(v, torch.Tensor) and v.is_floating_point())
    obj["model"][key] = obj["model"][key] + 1
    torch.save(obj, path)
    return path


def test_export_and_verify_refuse_a_rank_file_changed_after_the_conversion(mcore_dir, hf_dir, tiny_cfg, tmp_path):
    copy = shutil.copytree(mcore_dir, tmp_path / "mcore")
    changed = _retamper_rank_file(copy)
    with pytest.raises(CheckpointError, match=f"^{changed}: sha256 .* differs") as e:
        convert_mcore_to_hf(copy, tmp_path / "hf_out", progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "hf_out").exists()
    with pytest.raises(CheckpointError, match="sha256 .* differs"):
        verify_hf_mcore_pair(hf_dir, copy, TP2, tiny_cfg, progress=False)


def test_c1_refuses_a_rank_file_changed_after_the_conversion(mcore_dir, tmp_path, monkeypatch):
    from verl_patches.patches.verl.workers import legacy_checkpoint as c1

    copy = shutil.copytree(mcore_dir, tmp_path / "mcore")
    monkeypatch.setattr(
        c1, "running_layout", lambda: c1.RunningLayout(tp=2, pp=1, ep=1, tp_rank=0, pp_rank=0, ep_rank=0)
    )
    # an unchanged checkpoint passes the digest (and then fails the strict copy into an empty module)
    with pytest.raises(CheckpointError, match="parameters do not match"):
        c1.load_legacy_weights([torch.nn.Linear(1, 1)], str(copy))
    changed = next(p for p in sorted(copy.rglob("model_optim_rng.pt")) if "mp_rank_00" in str(p))
    obj = torch.load(changed, weights_only=False)  # noqa: S614 - our own converter's file, read to alter it
    torch.save(obj, changed)  # the same content saved again: other bytes, so not the file the manifest records
    with pytest.raises(CheckpointError, match=f"^{changed}: sha256 .* differs"):
        c1.load_legacy_weights([torch.nn.Linear(1, 1)], str(copy))


@pytest.mark.parametrize("value", [0.0, -0.0, -1.0, -1e-30])
@pytest.mark.parametrize("verify", [False, True])
def test_a_zero_or_negative_fp8_scale_is_refused_by_name(fp8_dir, tmp_path, value, verify):
    """DeepSeek's weight_scale_inv is always positive: zero would silently zero a block, a negative one negate it."""
    src = shutil.copytree(fp8_dir, tmp_path / "src")
    weight = "model.layers.2.self_attn.o_proj.weight"

    def poison(s):
        s[0, -1] = value
        return s

    _edit_tensor(src, weight + SCALE_SUFFIX, poison)
    if verify:  # --verify-only of an earlier, clean cast against the edited source
        from verl_patches.weights.verify import verify_fp8_cast

        run_fp8_cast(fp8_dir, tmp_path / "clean", progress=False)
        with pytest.raises((CheckpointError, VerifyError)) as e:
            verify_fp8_cast(src, tmp_path / "clean", progress=False)
    else:
        with pytest.raises(CheckpointError) as e:
            run_fp8_cast(src, tmp_path / "out", progress=False)
        assert not (tmp_path / "out" / INDEX).exists()
    assert repr(weight) in _one_line(e.value) and "non-positive" in str(e.value)


@pytest.mark.parametrize("value", [1e-45, 1e-38, 2.0**-25, 1.0000001, 1.5, 1e30])
@pytest.mark.parametrize("verify", [False, True])
def test_a_positive_finite_but_absurd_fp8_scale_is_refused_by_name(fp8_dir, tmp_path, value, verify):
    """Issue 41: 1e-45 zeroes the block as zero did, 1e30 makes weights of 4.5e32; outside
    dequant.SCALE_INV_RANGE a scale is refused by the weight's name, at conversion and in --verify."""
    src = shutil.copytree(fp8_dir, tmp_path / "src")
    weight = "model.layers.2.self_attn.o_proj.weight"

    def poison(s):
        s[-1, 0] = value
        return s

    _edit_tensor(src, weight + SCALE_SUFFIX, poison)
    if verify:  # --verify-only of an earlier, clean cast against the edited source
        from verl_patches.weights.verify import verify_fp8_cast

        run_fp8_cast(fp8_dir, tmp_path / "clean", progress=False)
        with pytest.raises(VerifyError) as e:
            verify_fp8_cast(src, tmp_path / "clean", progress=False)
    else:
        with pytest.raises(CheckpointError) as e:
            run_fp8_cast(src, tmp_path / "out", progress=False)
        assert not (tmp_path / "out" / INDEX).exists()
    line = _one_line(e.value)
    assert repr(weight) in line and "outside the plausible range" in line and "at block (" in line


def test_the_plausible_scale_range_keeps_every_scale_a_real_checkpoint_can_hold():
    """Its bounds themselves pass, and so does DeepSeek's smallest (an all-zero block: 1e-4 / 448)."""
    from verl_patches.weights.dequant import SCALE_INV_RANGE
    from verl_patches.weights.synthetic import quantize_fp8_blockwise

    lo, hi = SCALE_INV_RANGE
    w = torch.full((4, 4), 448.0).to(torch.float8_e4m3fn)
    for s in (lo, 1e-4 / 448, 3.5e-4, 0.02, hi):
        assert torch.isfinite(dequantize_fp8_blockwise(w, torch.tensor([[s]]).float()).float()).all(), s
    zero_block, scale = quantize_fp8_blockwise(torch.zeros(130, 3))
    assert torch.equal(dequantize_fp8_blockwise(zero_block, scale), torch.zeros(130, 3, dtype=torch.bfloat16))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_hf_to_mcore_refuses_a_non_finite_weight_by_name(hf_dir, tmp_path, value):
    src = shutil.copytree(hf_dir, tmp_path / "src")

    def poison(t):
        t.view(-1)[3] = value
        return t

    _edit_tensor(src, "model.layers.0.self_attn.o_proj.weight", poison)
    with pytest.raises(CheckpointError) as e:
        convert_hf_to_mcore(src, tmp_path / "mc", TP2, progress=False)
    line = _one_line(e.value)
    assert "self_attention.linear_proj.weight" in line and "non-finite" in line
    assert not list((tmp_path / "mc").rglob("model_optim_rng.pt"))


def test_mcore_to_hf_refuses_a_non_finite_weight_by_name(mcore_dir, tmp_path):
    import hashlib

    copy = shutil.copytree(mcore_dir, tmp_path / "mcore")
    path = sorted(copy.rglob("model_optim_rng.pt"))[0]
    obj = torch.load(path, weights_only=False)  # noqa: S614 - our own converter's file, read to alter it
    key = next(k for k, v in obj["model"].items() if v.is_floating_point() and v.dim() == 2)
    obj["model"][key].view(-1)[0] = float("nan")
    torch.save(obj, path)
    # the manifest rewritten too (the digest would refuse the file first): the non-finite check is tested here
    man = json.loads((copy / "conversion_manifest.json").read_text())
    man["ranks"][path.parent.name] = {
        "size": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    (copy / "conversion_manifest.json").write_text(json.dumps(man))
    with pytest.raises(CheckpointError, match="non-finite") as e:
        convert_mcore_to_hf(copy, tmp_path / "hf_out", progress=False)
    assert "\n" not in str(e.value) and "tensor 'model." in str(e.value)


@pytest.mark.parametrize(
    "key, value",
    [("rms_norm_eps", "NaN"), ("rope_theta", "Infinity"), ("rope_scaling", '{"factor": NaN, "type": "yarn"}')],
)
def test_a_non_finite_config_float_is_refused_by_key(hf_dir, tmp_path, key, value):
    src = shutil.copytree(hf_dir, tmp_path / "src")
    text = (src / "config.json").read_text()
    cfg = json.loads(text)
    cfg[key] = "__X__"
    (src / "config.json").write_text(json.dumps(cfg).replace('"__X__"', value))
    with pytest.raises(Exception) as e:
        convert_hf_to_mcore(src, tmp_path / "mc", TP2, progress=False)
    assert key in _one_line(e.value) and "finite" in str(e.value)
    r = _run_tool("make_config.py", "--out", str(tmp_path / "o"), "--set", f"{key}={value}")
    assert r.returncode == 2 and "Traceback" not in r.stderr and key in r.stderr and not (tmp_path / "o").exists()


def test_a_users_tmp_file_in_an_output_folder_is_never_deleted(fp8_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mine = out / ".tmp-notes.txt"  # the name earlier versions gave their temp files: now simply a user's file
    mine.write_text("keep me")
    with pytest.raises(ResumeError, match="files this tool did not write"):  # someone's file: not ours to replace
        run_fp8_cast(fp8_dir, out, progress=False)
    assert mine.read_text() == "keep me"
    ours = out / ".verl_patches-tmp-0123456789abcdef.model-00001-of-00002.safetensors"
    mine.unlink()
    ours.write_bytes(b"partial")
    run_fp8_cast(fp8_dir, out, progress=False)
    assert not ours.exists()


def test_export_of_an_actor_checkpoint_checks_the_step_manifests_digests(mcore_dir, tmp_path):
    """An actor checkpoint (global_step_N/actor, in our converter's layout) records its files' digests in the
    step's checkpoint.json: the export compares them before it reads a rank file."""
    from verl_patches.checkpoint import commit
    from verl_patches.weights.manifest_file import ACTOR_CHECKPOINT_TOOL

    root = tmp_path / "ckpt"
    staging = commit.begin_step(root, 5)
    shutil.copytree(mcore_dir, staging / "actor")
    man = json.loads((staging / "actor" / "conversion_manifest.json").read_text())
    man["tool"], man["ranks"] = ACTOR_CHECKPOINT_TOOL, {}
    (staging / "actor" / "conversion_manifest.json").write_text(json.dumps(man))
    actor = commit.commit_step(root, staging, 5) / "actor"
    convert_mcore_to_hf(actor, tmp_path / "ok", progress=False)  # intact: exported
    path = sorted(actor.rglob("model_optim_rng.pt"))[0]
    obj = torch.load(path, weights_only=False)  # noqa: S614 - our own converter's file, read to alter it
    torch.save(obj, path)  # same tensors, other bytes: not the committed file
    with pytest.raises(CheckpointError, match=f"^{path}: sha256 .* differs") as e:
        convert_mcore_to_hf(actor, tmp_path / "bad", progress=False)
    assert "\n" not in str(e.value)
