"""One reader decides what an archive is (issue 41, must-have 1).

The check used to list a ``.pt`` file's entries with Python's ``zipfile`` while ``torch.load`` read it with its
own zip reader; crafted files are plain archives to the one and TorchScript archives to the other, and torch
2.5.1 hands a TorchScript archive to ``torch.jit.load`` even with ``weights_only=True``. Here every variant
(built byte by byte in `zip_craft`) goes through every load path (resume: the dataloader position, an actor
file and the optimizer state; export; the C1 load every actor and reference rank does; check_logprobs), with
the digest recorded for it resealed as an attacker who can write the manifest would (and, for a step manifest,
sign it with the run's secret: the strongest forger). Each path refuses it in
one line naming the file, or, where torch's reader sees a plain archive of tensors, loads it; no pickled code
runs (the planted payload would create a marker file) and ``torch.jit.load`` is never reached.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zip_craft as zc
from reseal import reseal_signed
from verl_patches.checkpoint import committed_role, optimizer_state, trainer_io
from verl_patches.checkpoint.safe_load import (
    CheckpointFileError,
    UnsafeCheckpointError,
    load_tensor_file,
    plain_archive_problem,
)

REPO = Path(__file__).resolve().parents[2]
TORCHSCRIPT = "a TorchScript archive"
WEIGHTS_ONLY = "refused by the weights-only loader.*posix.system"

# variant -> what every path must say about it (a regex after "<file>: "), or None: torch's reader sees a plain
# archive of tensors and the file loads
EXPECTED: dict[str, str | None] = {
    "torchscript": TORCHSCRIPT,
    "zip64 two end records": TORCHSCRIPT,
    "directory offset not where its size puts it": TORCHSCRIPT,
    "zip64 with a payload": WEIGHTS_ONLY,
    "zip64 genuine": None,
    "duplicate name": "'data.pkl' appears twice",
    "duplicate name but for case": "'DATA.PKL' appears twice .*ignoring case",
    "overlapping entries with a payload": WEIGHTS_ONLY,
    "overlapping entry named constants.pkl": TORCHSCRIPT,
    "overlapping entries genuine": None,
    "prefixed script": "not a torch file in the zip format",
    "prefixed zip, appended as it is": "not a readable torch file",
    "prefixed zip, offsets of the file": TORCHSCRIPT,
}


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("archives")
    torch.save({"w": torch.arange(4.0)}, d / "good.pt")
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), d / "ts.pt")
    return SimpleNamespace(good=zc.records_of(d / "good.pt"), torchscript=(d / "ts.pt").read_bytes())


def variants(parts: SimpleNamespace, marker: Path) -> dict[str, bytes]:
    """Each variant's bytes; its data.pkl, where the variant has one of its own, is a payload that would
    create ``marker`` when unpickled."""
    good, f = parts.good, zc.folder_of(parts.good)
    evil = [(n, zc.payload_pickle(marker) if n.endswith("/data.pkl") else b) for n, b in good]
    script = [(f"{f}/constants.pkl", b"\x80\x02)."), (f"{f}/code/__torch__/m.py", b"x")]
    out = {
        "torchscript": parts.torchscript,
        "zip64 two end records": zc.zip64_two_ends(evil, evil + script),
        "directory offset not where its size puts it": zc.offset_mismatch(evil, evil + script),
        "zip64 with a payload": zc.zip64_zip(evil),
        "zip64 genuine": zc.zip64_zip(good),
        "duplicate name": zc.plain_zip(good + [(f"{f}/data.pkl", zc.payload_pickle(marker))]),
        "duplicate name but for case": zc.plain_zip(good + [(f"{f}/DATA.PKL", zc.payload_pickle(marker))]),
        "overlapping entries with a payload": zc.overlapping(evil, f"{f}/data/1", f"{f}/data.pkl"),
        "overlapping entry named constants.pkl": zc.overlapping(good, f"{f}/constants.pkl", f"{f}/data.pkl"),
        "overlapping entries genuine": zc.overlapping(good, f"{f}/data/1", f"{f}/data/0"),
        "prefixed script": zc.prefixed(b"#!/bin/sh\ntouch x\nexit\n", evil, absolute=True),
        "prefixed zip, appended as it is": zc.prefixed(zc.plain_zip(good), evil + script, absolute=False),
        "prefixed zip, offsets of the file": zc.prefixed(zc.plain_zip(good), evil + script, absolute=True),
    }
    assert set(out) == set(EXPECTED)
    return out


@pytest.fixture
def guard(tmp_path: Path, monkeypatch) -> SimpleNamespace:
    """The payload's marker, and every way into TorchScript loading replaced by one that records and creates it."""
    g = SimpleNamespace(marker=tmp_path / "payload-ran", reached=[])

    def tripwire(name: str) -> Callable[..., Any]:
        def hit(*a: Any, **k: Any) -> None:
            g.reached.append(name)
            g.marker.touch()
            raise AssertionError(f"{name} reached")

        return hit

    monkeypatch.setattr(torch.jit, "load", tripwire("torch.jit.load"))
    monkeypatch.setattr(torch, "load", tripwire("torch.load"))
    for name in ("import_ir_module", "import_ir_module_from_buffer"):
        monkeypatch.setattr(torch._C, name, tripwire(f"torch._C.{name}"))
    yield g
    assert g.reached == [] and not g.marker.exists()


# --- the premise: the readers disagree, and torch.load runs TorchScript for what zipfile calls plain ---------------


@pytest.mark.parametrize("name", ["zip64 two end records", "directory offset not where its size puts it"])
def test_zipfile_sees_a_plain_archive_that_torch_loads_as_torchscript(parts, tmp_path, monkeypatch, name) -> None:
    path = tmp_path / "x.pt"
    path.write_bytes(variants(parts, tmp_path / "m")[name])
    with zipfile.ZipFile(path) as z:
        seen_by_zipfile = [n.split("/", 1)[1] for n in z.namelist()]
    assert plain_archive_problem(seen_by_zipfile) is None  # the former check's view: a plain torch.save archive
    with open(path, "rb") as f:
        assert "constants.pkl" in torch._C.PyTorchFileReader(f).get_all_records()
    dispatched = []
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: dispatched.append(a))
    with pytest.warns(UserWarning, match="TorchScript"):
        torch.load(path, weights_only=True)  # noqa: S614 - proves torch itself reaches torch.jit.load
    assert dispatched


# --- the loader itself ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("mmap", [False, True])
def test_each_variant_is_refused_by_name_or_loaded_as_torch_reads_it(parts, tmp_path, guard, name, mmap) -> None:
    path = tmp_path / "x.pt"
    path.write_bytes(variants(parts, guard.marker)[name])
    expected = EXPECTED[name]
    if expected is None:
        got = load_tensor_file(path, mmap=mmap, expected_sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        assert torch.equal(got["w"], torch.arange(4.0))
        return
    with pytest.raises(CheckpointFileError, match=f"^{path}: (.*)?{expected}") as e:
        load_tensor_file(path, mmap=mmap)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_check_and_the_loader_see_the_same_records(parts, tmp_path, guard, name) -> None:
    """The invariant itself: what the loader decides follows from torch's own listing of the file."""
    path = tmp_path / "x.pt"
    path.write_bytes(variants(parts, guard.marker)[name])
    try:
        with open(path, "rb") as f:
            records = torch._C.PyTorchFileReader(f).get_all_records()
    except RuntimeError:
        records = None
    try:
        load_tensor_file(path)
        loaded = True
    except UnsafeCheckpointError:
        loaded = False
    except CheckpointFileError:
        loaded = None
    if records is not None and "constants.pkl" in records:
        assert loaded is False  # torch.load would have dispatched it to torch.jit.load
    if loaded:
        assert records is not None and plain_archive_problem(records) is None


# --- every load path --------------------------------------------------------------------------------------------


def _reseal_step(step: Path, rel: str) -> None:
    """The step manifest's size and sha256 of ``rel`` made to match the file again, and the manifest signed
    again with the run's secret: the strongest forger (one without the secret is stopped by the signature
    before any archive is opened: tests/checkpoint/test_run_identity.py), so the archive reader is what is
    tested here."""
    reseal_signed(step, rel)


def _reseal_conversion(mcore: Path, rank_dir: str) -> None:
    man_path = mcore / "conversion_manifest.json"
    man = json.loads(man_path.read_text())
    data = next(mcore.glob(f"iter_*/{rank_dir}/model_optim_rng.pt")).read_bytes()
    man["ranks"][rank_dir] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    man_path.write_text(json.dumps(man))


class _Workers:
    """An actor worker group of one rank: saves an RNG file and a rank record, loads nothing."""

    def save_checkpoint(self, path: str, hdfs: None, step: int, max_ckpt_to_keep=None) -> None:
        from verl_patches.checkpoint.manifest import RankRecord, TrainLayout, rank_record_name
        from verl_patches.checkpoint.safe_load import sha256_file

        role = Path(path)
        rel = "rng/rank_00000.pt"
        (role / rel).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"random": torch.zeros(2)}, role / rel)
        (role / "optim").mkdir()
        torch.save({"param": torch.ones(3)}, role / "optim/mp_rank_00_000_000_params.pt")
        files = [rel, "optim/mp_rank_00_000_000_params.pt"]
        rec = RankRecord(
            rank=0,
            layout=TrainLayout(tp=1, pp=1, ep=1, dp=1),
            tp_rank=0,
            pp_rank=0,
            ep_rank=0,
            dp_rank=0,
            files={r: (role / r).stat().st_size for r in files},
            sha256={r: sha256_file(role / r) for r in files},
        )
        (role / rank_record_name(0)).parent.mkdir(parents=True, exist_ok=True)
        (role / rank_record_name(0)).write_text(json.dumps(rec.to_json()))

    def load_checkpoint(self, path: str, del_local_after_load: bool = False) -> None:
        pass


def _trainer(root: Path) -> SimpleNamespace:
    from omegaconf import OmegaConf

    cfg = {"default_local_dir": str(root), "default_hdfs_dir": None, "resume_mode": "auto"}
    cfg.update(resume_from_path=None, max_actor_ckpt_to_keep=None)
    return SimpleNamespace(
        config=OmegaConf.create({"trainer": cfg}),
        actor_rollout_wg=_Workers(),
        train_dataloader=SimpleNamespace(state_dict=lambda: {"position": 1}, load_state_dict=lambda s: None),
        global_steps=2,
        total_training_steps=10,
        use_critic=False,
    )


def _saved_step(root: Path) -> Path:
    trainer_io.save_step(_trainer(root))
    return root / "global_step_2"


def _resume_position(tmp: Path, blob: bytes, monkeypatch) -> tuple[Path, Callable[[], Any]]:
    step = _saved_step(tmp / "ck")
    (step / "data.pt").write_bytes(blob)
    _reseal_step(step, "data.pt")
    return step / "data.pt", lambda: trainer_io.load_latest(_trainer(tmp / "ck"))


def _resume_actor_file(tmp: Path, blob: bytes, monkeypatch) -> tuple[Path, Callable[[], Any]]:
    step = _saved_step(tmp / "ck")
    rel = "rng/rank_00000.pt"
    (step / "actor" / rel).write_bytes(blob)
    _reseal_step(step, f"actor/{rel}")
    return step / "actor" / rel, lambda: committed_role.CommittedRole.open(step / "actor").load(rel)


def _resume_optimizer(tmp: Path, blob: bytes, monkeypatch) -> tuple[Path, Callable[[], Any]]:
    step = _saved_step(tmp / "ck")
    rel = "optim/mp_rank_00_000_000_params.pt"
    (step / "actor" / rel).write_bytes(blob)
    _reseal_step(step, f"actor/{rel}")
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    opt = SimpleNamespace(data_parallel_group=None, load_parameter_state_from_dp_zero=lambda state: None)

    def load() -> None:
        path, sha = committed_role.CommittedRole.open(step / "actor").path(rel)
        optimizer_state.load_parameter_state(opt, path, sha)

    return step / "actor" / rel, load


@pytest.fixture(scope="module")
def mcore_dir(tmp_path_factory) -> Path:
    """A tiny converted Megatron checkpoint of one rank (TP1), as the converter writes it."""
    from verl_patches.weights.config import make_tiny_config
    from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore
    from verl_patches.weights.layout import ParallelLayout
    from verl_patches.weights.synthetic import write_synthetic_checkpoint

    d = tmp_path_factory.mktemp("mcore")
    sizes = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=16, num_hidden_layers=2)
    cfg = make_tiny_config(256, first_k_dense_replace=1, n_routed_experts=8, **sizes)
    write_synthetic_checkpoint(d / "hf", cfg, fp8=False, num_shards=1, seed=3)
    convert_hf_to_mcore(d / "hf", d / "mcore", ParallelLayout(moe_grouped_gemm=True), progress=False)
    return d / "mcore"


def _planted_rank_file(tmp: Path, mcore_dir: Path, blob: bytes) -> tuple[Path, Path]:
    copy = tmp / "mcore"
    shutil.copytree(mcore_dir, copy)
    (rank,) = sorted(copy.glob("iter_*/mp_rank_*/model_optim_rng.pt"))
    rank.write_bytes(blob)
    _reseal_conversion(copy, rank.parent.name)
    return copy, rank


def _export(tmp: Path, blob: bytes, monkeypatch, mcore_dir: Path) -> tuple[Path, Callable[[], Any]]:
    from verl_patches.weights.mcore_to_hf import convert_mcore_to_hf

    copy, rank = _planted_rank_file(tmp, mcore_dir, blob)
    return rank, lambda: convert_mcore_to_hf(copy, tmp / "hf_out", progress=False)


def _c1(tmp: Path, blob: bytes, monkeypatch, mcore_dir: Path) -> tuple[Path, Callable[[], Any]]:
    from verl_patches.patches.verl.workers import legacy_checkpoint as c1

    copy, rank = _planted_rank_file(tmp, mcore_dir, blob)
    monkeypatch.setattr(c1, "running_layout", lambda: c1.RunningLayout(1, 1, 1, 0, 0, 0))
    return rank, lambda: c1.load_legacy_weights([torch.nn.Linear(1, 1)], str(copy))


def _check_logprobs(tmp: Path, blob: bytes, monkeypatch) -> tuple[Path, Callable[[], Any]]:
    from verl_patches.checks import run

    path = tmp / "out" / "megatron_dp0.pt"
    path.parent.mkdir()
    path.write_bytes(blob)
    return path, lambda: run._load_tensor(path)


PATHS = {
    "resume: dataloader position": _resume_position,
    "resume: actor file": _resume_actor_file,
    "resume: optimizer state": _resume_optimizer,
    "export": _export,
    "C1": _c1,
    "check_logprobs": _check_logprobs,
}
_NEEDS_MCORE = {"export", "C1"}


@pytest.mark.parametrize("path_name", list(PATHS))
@pytest.mark.parametrize("name", [n for n, want in EXPECTED.items() if want is not None])
def test_every_load_path_refuses_every_variant_in_one_line(
    parts, tmp_path, guard, monkeypatch, request, path_name, name
) -> None:
    blob = variants(parts, guard.marker)[name]
    extra = (request.getfixturevalue("mcore_dir"),) if path_name in _NEEDS_MCORE else ()
    planted, load = PATHS[path_name](tmp_path, blob, monkeypatch, *extra)
    with pytest.raises(Exception) as e:
        load()
    text = str(e.value)
    assert "\n" not in text, text
    assert text.startswith(f"{planted}: "), text
    assert re.search(EXPECTED[name], text), text


def test_the_export_tool_refuses_in_one_line_without_a_traceback(parts, tmp_path, mcore_dir) -> None:
    """The same, end to end through the command line (a fresh interpreter whose torch.jit.load creates the
    marker if it is ever called)."""
    marker = tmp_path / "payload-ran"
    for name in ("zip64 two end records", "directory offset not where its size puts it", "duplicate name"):
        case = tmp_path / name.replace(" ", "_")
        case.mkdir()
        copy, rank = _planted_rank_file(case, mcore_dir, variants(parts, marker)[name])
        tripwire = (
            "import runpy, sys, torch\n"
            f"torch.jit.load = lambda *a, **k: open({str(marker)!r}, 'w')\n"
            "sys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n"
        )
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                tripwire,
                str(REPO / "verl_patches/scripts/convert_ckpt_deepseek3.py"),
                "--reverse",
                "--load-dir",
                str(copy),
                "--save-dir",
                str(case / "hf_out"),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=300,
        )
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"error: {rank}: "), r.stderr
        assert not marker.exists()


# --- the same invariant on files no one wrote by hand -------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_archives_never_reach_torchscript_or_pickled_code(parts, tmp_path, guard, data) -> None:
    """Random byte edits of the disagreeing variants: whatever torch's reader makes of the result, the loader
    refuses it in one line or loads tensors, and never anything torch would dispatch to torch.jit.load."""
    name = data.draw(st.sampled_from(["zip64 two end records", "directory offset not where its size puts it"]))
    blob = bytearray(variants(parts, guard.marker)[name])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    path = tmp_path / "m.pt"
    path.write_bytes(bytes(blob))
    try:
        with open(path, "rb") as f:
            records = torch._C.PyTorchFileReader(f).get_all_records()
    except Exception:  # noqa: BLE001 - any refusal of torch's reader
        records = None
    try:
        got = load_tensor_file(path, mmap=data.draw(st.booleans()))
    except CheckpointFileError as err:
        assert str(err).startswith(f"{path}: ") and "\n" not in str(err)
        return
    assert records is not None and "constants.pkl" not in records
    assert isinstance(got, dict)
