"""Property-based tests of the checkpoint parsers against arbitrary bytes (issue #27, must-have 8): the tracker,
step numbers, the step manifest, rank records and file names. Each either parses or raises its one named
error with a one-line message; a parsed name never leads outside its folder."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from verl_patches.base.strict_int import MAX_STEP_DIGITS, StepNumberError, parse_step_int
from verl_patches.checkpoint import commit
from verl_patches.checkpoint.confine import ConfinementError, check_relpath
from verl_patches.checkpoint.manifest import (
    MANIFEST_FILE,
    CheckpointIncomplete,
    FileRecord,
    manifest_json,
    parse_manifest,
    parse_rank_record,
)
from verl_patches.checkpoint.tracker import TrackerError, read_megatron_tracker, read_tracker

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
HOSTILE = st.sampled_from(["..", ".", "", "/", "a", "b.pt", "\\", "\x00", "\n", "²", "~", "-", " ", "..."])
hostile_names = st.lists(HOSTILE, min_size=1, max_size=6).map("".join) | st.text(max_size=40)


def one_line(err: Exception) -> bool:
    return "\n" not in str(err) and len(str(err)) < 1500


@SETTINGS
@given(st.binary(max_size=80))
@example("²".encode())
@example(b"9" * 5000)
@example(b"\xff\xfe12")
@example(b"12\n")
@example(b"0012")
def test_tracker_arbitrary_bytes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "latest_checkpointed_iteration.txt"
        p.write_bytes(data)
        for reader in (read_tracker, read_megatron_tracker):
            try:
                got = reader(p)
            except TrackerError as err:
                assert one_line(err) and str(err).startswith(str(p))
                continue
            if got == "release":
                assert reader is read_megatron_tracker and data.strip() == b"release"
                continue
            digits = data.strip(b" \t\r\n")
            assert isinstance(got, int) and 0 <= got < 10**MAX_STEP_DIGITS
            assert digits.isdigit() and all(48 <= c <= 57 for c in digits) and int(digits) == got


@SETTINGS
@given(st.text(max_size=20) | st.binary(max_size=20))
@example("²")
@example("1_000")
@example(" 1")
@example("+1")
@example("1" * 13)
def test_step_int_is_ascii_digits_only(text) -> None:
    try:
        got = parse_step_int(text, "--iteration")
    except StepNumberError as err:
        assert one_line(err) and str(err).startswith("--iteration: ")
        return
    raw = text.decode("ascii") if isinstance(text, bytes) else text
    assert 1 <= len(raw) <= MAX_STEP_DIGITS and set(raw) <= set("0123456789") and int(raw) == got


def inside(folder: str, rel: str) -> bool:
    return os.path.normpath(os.path.join(folder, rel)).startswith(folder + os.sep)


@SETTINGS
@given(hostile_names)
@example("../x")
@example("/etc/passwd")
@example("a/../../x")
@example("a/./b")
def test_relpath_never_leaves_its_folder(rel: str) -> None:
    try:
        got = check_relpath(rel, "m")
    except ConfinementError as err:
        assert one_line(err)
        return
    assert got == rel and inside("/ck/global_step_1", rel)
    assert os.path.normpath(rel) == rel  # nothing to collapse: the name is what is opened


@SETTINGS
@given(st.binary(max_size=400))
def test_manifest_arbitrary_bytes(data: bytes) -> None:
    try:
        m = parse_manifest(data, "s/checkpoint.json")
    except CheckpointIncomplete as err:
        assert one_line(err) and str(err).startswith("s/checkpoint.json")
        return
    assert all(inside("/ck/global_step_1", rel) for rel in m.files)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | hostile_names,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(hostile_names, kids, max_size=3),
    max_leaves=8,
)


@SETTINGS
@given(
    st.dictionaries(
        hostile_names,
        st.fixed_dictionaries(
            {"bytes": st.integers(-2, 10**20), "sha256": st.sampled_from(["ab" * 32, "x", "AB" * 32])}
        )
        | st.dictionaries(hostile_names, json_values, max_size=3),
        max_size=4,
    ),
    st.dictionaries(hostile_names, st.none() | json_values, max_size=3),
    json_values,
    st.integers(-1, 2),
)
def test_manifest_structured_fuzz(files, roles, step, version_shift: int) -> None:
    """Near-valid manifests with hostile names and values: parsed ones only name files inside the step folder."""
    doc = {
        "version": 3 + version_shift // 2,
        "step": step if not isinstance(step, (list, dict)) else 1,
        "roles": roles,
        "files": files,
        "signature": {"hmac_sha256": "cd" * 32},  # its shape: the run's secret is checked by the reader
    }
    try:
        m = parse_manifest(json.dumps(doc), "s/checkpoint.json")
    except CheckpointIncomplete as err:
        assert one_line(err)
        return
    assert all(inside("/ck/global_step_1", rel) and rel != MANIFEST_FILE for rel in m.files)
    assert all(inside("/ck/global_step_1", role) and "/" not in role for role in m.roles)


@SETTINGS
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_rank_record_arbitrary_bytes(data: bytes) -> None:
    try:
        rec = parse_rank_record(data, "r.json")
    except CheckpointIncomplete as err:
        assert one_line(err)
        return
    assert all(inside("/ck/actor", rel) for rel in list(rec.files) + list(rec.sha256))


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["garbage", "valid-prefix"]))
def test_step_folder_with_arbitrary_manifest_is_skipped_with_a_reason(data: bytes, mode: str) -> None:
    """The resume never raises on a broken newest step: it falls back and names the step and why."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        staging = commit.begin_step(root, 1)
        (staging / "data.pt").write_bytes(b"d")
        commit.commit_step(root, staging, 1)
        broken = root / "global_step_2"
        broken.mkdir()
        if mode == "valid-prefix":
            good = json.dumps(manifest_json(2, {}, {"data.pt": FileRecord(1, "ab" * 32)})).encode()
            data = good[: len(data) % (len(good) + 1)] + data
        (broken / MANIFEST_FILE).write_bytes(data)
        (root / "latest_checkpointed_iteration.txt").write_bytes(data[:20])
        point = commit.find_resume(root)
        assume(point.step == 1)  # a random manifest that happens to be complete is resumed from, rightly
        assert "\n" not in point.note and point.note.startswith("global_step_2 skipped: ")
