"""No checkpoint file is ever unpickled (issue #27, must-have 1), on the library set's torch (2.5.1, whose
``torch.load`` defaults to ``weights_only=False``).

A tampered file replaces a real checkpoint file with a pickle of the same size whose ``__reduce__`` would
create a marker file when unpickled. It is refused by its sha256 before it is read; with a digest that
matches it (the manifest rewritten too, or no digest given) the weights-only loader refuses it by name.
The marker is never created. The resume's readers (actor files, the distributed optimizer's parameter
state, the dataloader position) all go through the same loader.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reseal import reseal_signed
from verl_patches.checkpoint import commit, committed_role, optimizer_state, safe_load
from verl_patches.checkpoint.manifest import CheckpointIncomplete, RankRecord, TrainLayout, rank_record_name
from verl_patches.checkpoint.safe_load import CheckpointFileError, UnsafeCheckpointError, load_tensor_file, sha256_file


class _Payload:
    """Unpickling this calls os.system: what a tampered checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def tampered_bytes(marker: Path, size: int) -> bytes:
    """A pickle whose unpickling runs code, padded after its STOP opcode to exactly ``size`` bytes (sizes alone
    cannot tell it from the file it replaces). torch.load unpickles it at once: in a legacy-format read of the
    "magic number", before any format check."""
    data = pickle.dumps(_Payload(marker), protocol=2)
    assert len(data) <= size, f"cannot fit the payload in {size} bytes"
    return data + b"\0" * (size - len(data))


def test_torch_is_the_library_sets_and_unsafe_by_default(tmp_path: Path) -> None:
    """The premise: on this torch a bare torch.load runs the payload (so the tests below test something)."""
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    evil.write_bytes(tampered_bytes(marker, 2000))
    assert torch.__version__.startswith("2.5.1")
    try:
        torch.load(evil)  # noqa: S614 - proves the default unpickles on this torch
    except Exception:  # noqa: BLE001 - after the payload ran, the magic-number check fails
        pass
    assert marker.exists()


@pytest.mark.parametrize("fmt", ["legacy pickle", "torch zip"])
def test_weights_only_loader_refuses_the_payload_by_name(tmp_path: Path, fmt: str) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    if fmt == "torch zip":
        torch.save({"w": torch.ones(2), "x": _Payload(marker)}, evil)
    else:
        evil.write_bytes(tampered_bytes(marker, 2000))
    for kwargs in ({}, {"mmap": True}, {"expected_sha256": sha256_file(evil)}):  # no digest, or a matching one
        with pytest.raises(UnsafeCheckpointError, match=f"^{evil}: ") as e:
            load_tensor_file(evil, **kwargs)
        if fmt == "torch zip":
            assert "refused by the weights-only loader" in str(e.value) and "posix.system" in str(e.value)
        else:  # only the zip format torch.save writes is handed to torch at all
            assert "legacy or foreign format" in str(e.value)
        assert "\n" not in str(e.value)
    assert not marker.exists()


def test_digest_mismatch_is_refused_before_reading(tmp_path: Path, monkeypatch) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(4.0)}, good)
    digest = sha256_file(good)
    assert torch.equal(load_tensor_file(good, expected_sha256=digest)["w"], torch.arange(4.0))
    marker = tmp_path / "ran"
    good.write_bytes(tampered_bytes(marker, good.stat().st_size))
    calls = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(a))
    with pytest.raises(UnsafeCheckpointError, match=f"^{good}: sha256 .* differs from the .* recorded"):
        load_tensor_file(good, expected_sha256=digest)
    with pytest.raises(UnsafeCheckpointError, match="differs"):
        load_tensor_file(good, expected_sha256=digest, mmap=True)
    assert calls == [] and not marker.exists()  # torch.load was never reached


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda p: None, "missing"),
        (lambda p: p.mkdir(), "not a regular file"),
        (lambda p: os.mkfifo(p), "not a regular file"),  # would block a reader
        (lambda p: p.write_bytes(b"PK\x03\x04 not really a zip"), "not a torch file|not a readable torch file"),
        (lambda p: p.write_bytes(b""), "not a torch file|not a readable torch file"),
    ],
)
def test_unreadable_files_are_one_line(tmp_path: Path, make, needle: str) -> None:
    p = tmp_path / "f.pt"
    make(p)
    with pytest.raises(CheckpointFileError, match=needle) as e:
        load_tensor_file(p)
    assert "\n" not in str(e.value) and str(e.value).startswith(str(p))


# --- the resume's readers -------------------------------------------------------------------------------------

LAYOUT = TrainLayout(tp=1, pp=1, ep=1, dp=1)


def committed_actor(root: Path) -> Path:
    """A committed step whose actor folder holds a rank's RNG file, an optimizer file and the tracker."""
    staging = commit.begin_step(root, 3)
    role = staging / "actor"
    files = {"rng/rank_00000.pt": {"random": 1}, "optim/mp_rank_00_000_000_params.pt": {"param": torch.ones(3)}}
    sizes, digests = {}, {}
    for rel, obj in files.items():
        (role / rel).parent.mkdir(parents=True, exist_ok=True)
        torch.save(obj, role / rel)
    (role / "latest_checkpointed_iteration.txt").write_text("3")
    for rel in list(files) + ["latest_checkpointed_iteration.txt"]:
        sizes[rel], digests[rel] = (role / rel).stat().st_size, sha256_file(role / rel)
    rec = RankRecord(rank=0, layout=LAYOUT, tp_rank=0, pp_rank=0, ep_rank=0, dp_rank=0, files=sizes, sha256=digests)
    (role / rank_record_name(0)).parent.mkdir(parents=True)
    (role / rank_record_name(0)).write_text(json.dumps(rec.to_json()))
    torch.save({"position": 1}, staging / "data.pt")
    return commit.commit_step(root, staging, 3) / "actor"


def tamper(path: Path, marker: Path, fix_manifest: bool) -> None:
    path.write_bytes(tampered_bytes(marker, path.stat().st_size))
    if fix_manifest:  # the attacker rewrites the digest too, and signs it: the weights-only loader still refuses
        step = path
        while not (step / "checkpoint.json").exists():
            step = step.parent
        reseal_signed(step, path.relative_to(step).as_posix())


@pytest.mark.parametrize(
    "fix_manifest,needle", [(False, "sha256 .* differs"), (True, "not a torch file in the zip format")]
)
def test_tampered_rng_file_of_an_actor_is_refused_by_name(tmp_path: Path, fix_manifest: bool, needle: str) -> None:
    role = committed_actor(tmp_path)
    committed = committed_role.CommittedRole.open(role)
    assert committed.step == 3 and committed.load("rng/rank_00000.pt") == {"random": 1}
    marker = tmp_path / "ran"
    target = role / "rng/rank_00000.pt"
    tamper(target, marker, fix_manifest)
    assert commit.is_complete(role.parent)  # same size: complete by sizes
    with pytest.raises(UnsafeCheckpointError, match=f"^{target}: {needle}"):
        committed_role.CommittedRole.open(role).load("rng/rank_00000.pt")
    assert not marker.exists()


@pytest.mark.parametrize(
    "fix_manifest,needle", [(False, "sha256 .* differs"), (True, "not a torch file in the zip format")]
)
def test_tampered_optimizer_param_state_is_never_unpickled(
    tmp_path: Path, monkeypatch, fix_manifest: bool, needle: str
) -> None:
    """Megatron's load_parameter_state would torch.load this file bare; ours reads it on DP rank 0 through
    the safe loader and hands the state to load_parameter_state_from_dp_zero."""
    role = committed_actor(tmp_path)
    rel = "optim/mp_rank_00_000_000_params.pt"
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    got = []
    opt = SimpleNamespace(data_parallel_group=None, load_parameter_state_from_dp_zero=got.append)
    path, sha = committed_role.CommittedRole.open(role).path(rel)
    optimizer_state.load_parameter_state(opt, path, sha)
    assert torch.equal(got[0]["param"], torch.ones(3))
    marker = tmp_path / "ran"
    tamper(role / rel, marker, fix_manifest)
    path, sha = committed_role.CommittedRole.open(role).path(rel)
    with pytest.raises(UnsafeCheckpointError, match=f"^{role / rel}: {needle}"):
        optimizer_state.load_parameter_state(opt, path, sha)
    assert not marker.exists() and len(got) == 1


def test_chained_optimizer_reads_once_on_dp_rank_zero_and_scatters_on_all(tmp_path: Path, monkeypatch) -> None:
    states = [{"a": torch.zeros(2)}, {"b": torch.ones(2)}]
    f = tmp_path / "params.pt"
    torch.save(states, f)
    for dp_rank in (0, 1):
        monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None, r=dp_rank: r)
        got: list = []
        inner = [
            SimpleNamespace(data_parallel_group=None, load_parameter_state_from_dp_zero=got.append) for _ in states
        ]
        optimizer_state.load_parameter_state(SimpleNamespace(chained_optimizers=inner), f, sha256_file(f))
        if dp_rank == 0:
            assert [sorted(s) for s in got] == [["a"], ["b"]]
        else:
            assert got == [None, None]  # the other DP ranks receive their shares in the scatter
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    inner = [SimpleNamespace(data_parallel_group=None, load_parameter_state_from_dp_zero=lambda s: None)] * 3
    with pytest.raises(CheckpointFileError, match="expected a list of 3 optimizer states, found list of 2"):
        optimizer_state.load_parameter_state(SimpleNamespace(chained_optimizers=inner), f, sha256_file(f))


@pytest.mark.needs_components("megatron")
def test_the_upstream_loaders_mirrored_are_unchanged() -> None:
    """optimizer_state does what Megatron's load_parameter_state methods do; a change upstream is caught here."""
    from verl_patches.patching.fingerprint import fingerprint_target

    for target, fp in optimizer_state.MIRRORED.items():
        assert fingerprint_target(target) == fp, target


def test_actor_files_outside_the_manifest_or_behind_links_are_refused(tmp_path: Path) -> None:
    role = committed_actor(tmp_path)
    committed = committed_role.CommittedRole.open(role)
    (role / "rng/extra.pt").write_bytes(b"x")
    with pytest.raises(CheckpointIncomplete, match="extra.pt: not listed in .*checkpoint.json"):
        committed.load("rng/extra.pt")
    outside = tmp_path / "outside"
    os.rename(role / "rng", outside)
    os.symlink(outside, role / "rng")
    with pytest.raises(CheckpointIncomplete, match="rng: is a symbolic link"):
        committed.load("rng/rank_00000.pt")
    with pytest.raises(CheckpointIncomplete, match="not a role folder of the committed step"):
        committed_role.CommittedRole.open(role.parent / "critic")
    staging = commit.begin_step(tmp_path, 5)
    (staging / "actor").mkdir()
    with pytest.raises(CheckpointIncomplete, match="checkpoint.json: missing"):
        committed_role.CommittedRole.open(staging / "actor")


def _calls(tree, dotted: str) -> int:
    """How many calls in ``tree`` are to ``dotted`` spelled in full (``torch.serialization._load``)."""
    import ast

    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts, f = [], node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name) and ".".join([f.id, *reversed(parts)]) == dotted:
                n += 1
    return n


def test_no_bare_torch_load_anywhere_in_verl_patches() -> None:
    """No module of ours calls torch.load, torch.jit.load or pickle.load on a file: every .pt is read by
    safe_load, which hands its own parse to torch's archive loader (one call, with the weights-only
    unpickler)."""
    import ast

    pkg = Path(commit.__file__).parents[1]
    found = {}
    for p in sorted(pkg.rglob("*.py")):
        tree = ast.parse(p.read_text())
        for name in ("torch.load", "torch.jit.load", "pickle.load", "torch.serialization._load"):
            if _calls(tree, name):
                found[(p.relative_to(pkg).as_posix(), name)] = _calls(tree, name)
    assert found == {("checkpoint/safe_load.py", "torch.serialization._load"): 1}
    src = Path(safe_load.__file__).read_text()
    assert "_weights_only_unpickler, overall_storage=overall" in src  # that one call is the weights-only one


def test_the_torch_loader_mirrored_is_unchanged() -> None:
    """safe_load does what torch.load(weights_only=True) does for a plain zip, on its own parse; a torch whose
    loader changed is caught here."""
    from verl_patches.patching.fingerprint import fingerprint_target

    for target, fp in safe_load.MIRRORED.items():
        assert fingerprint_target(target) == fp, target


# --- TorchScript and foreign zip archives (torch 2.5.1 hands a TorchScript zip to torch.jit.load) -----------------


def torchscript_archive(path: Path) -> Path:
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    return path


def rezip(src: Path, dst: Path, edit) -> Path:
    """A copy of the torch.save archive ``src`` with its entries changed by ``edit(list of (name, bytes))``."""
    import zipfile

    with zipfile.ZipFile(src) as zf:
        entries = [(n, zf.read(n)) for n in zf.namelist()]
    with zipfile.ZipFile(dst, "w") as zf:
        for name, data in edit(entries):
            zf.writestr(name, data)
    return dst


def test_weights_only_runs_torchscript_through_jit_load_on_this_torch(tmp_path: Path, monkeypatch) -> None:
    """The premise: weights_only=True does not protect a TorchScript archive on torch 2.5.1."""
    archive = torchscript_archive(tmp_path / "model.pt")
    calls = []
    real = torch.jit.load
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    with pytest.warns(UserWarning, match="TorchScript"):
        torch.load(archive, weights_only=True)  # noqa: S614 - proves the code-running path is reached
    assert calls


def test_a_torchscript_archive_never_reaches_torch(tmp_path: Path, monkeypatch) -> None:
    archive = torchscript_archive(tmp_path / "model.pt")
    reached = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: reached.append("torch.load"))
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: reached.append("torch.jit.load"))
    for kwargs in ({}, {"mmap": True}, {"expected_sha256": sha256_file(archive)}):
        with pytest.raises(UnsafeCheckpointError, match=f"^{archive}: a TorchScript archive") as e:
            load_tensor_file(archive, **kwargs)
        assert "\n" not in str(e.value)
    assert reached == []


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda es: es + [(es[0][0].split("/")[0] + "/constants.pkl", b"x")], "a TorchScript archive"),
        (lambda es: es + [(es[0][0].split("/")[0] + "/code/__torch__/m.py", b"x")], "a TorchScript archive"),
        (
            lambda es: es + [(es[0][0].split("/")[0] + "/extra/run.py", b"x")],
            "'extra/run.py' is not one torch.save writes",
        ),
        (lambda es: es + [("other/data.pkl", b"x")], "not under one archive folder"),
        (lambda es: es + [es[0]], "appears twice"),
        (lambda es: [e for e in es if not e[0].endswith("data.pkl")], "no data.pkl"),
    ],
)
def test_zip_archives_torch_save_does_not_write_are_refused_by_entry(tmp_path: Path, edit, needle: str) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(3.0)}, good)
    assert torch.equal(load_tensor_file(good)["w"], torch.arange(3.0))
    assert torch.equal(load_tensor_file(good, mmap=True)["w"], torch.arange(3.0))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name it was told to write
        bad = rezip(good, tmp_path / "bad.pt", edit)
    with pytest.raises(CheckpointFileError, match=needle) as e:
        load_tensor_file(bad)
    assert str(e.value).startswith(f"{bad}: ") and "\n" not in str(e.value)
