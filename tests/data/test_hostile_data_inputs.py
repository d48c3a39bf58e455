"""Hostile and careless inputs to json_to_parquet (issue 27): every row-level failure is a row error, only
regular files are read, a per-field length limit, a killed run's temp files cleaned (only ours), outputs
that follow the umask; property test against arbitrary bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_patches.base.atomic_write import host_tag
from verl_patches.data import parquet_io
from verl_patches.data.convert import convert
from verl_patches.data.errors import DeepscalerInputError, InputFileError, InvalidRowsError
from verl_patches.data.templates import TemplateError, resolve_template
from verl_patches.data.validation import DEFAULT_MAX_FIELD_CHARS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "verl_patches/scripts/json_to_parquet.py"


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(start, start + n)]


def run(*args: str | bytes, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, capture_output=True, timeout=120, **kw)


def _stderr_lines(r: subprocess.CompletedProcess) -> list[str]:
    err = r.stderr.decode("utf-8", "replace") if isinstance(r.stderr, bytes) else r.stderr
    assert "Traceback" not in err, err
    return [ln for ln in err.splitlines() if ln.strip()]


# ---- row-level failures are row errors ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_an_integer_beyond_the_digit_limit_is_a_row_error(tmp_path, fmt):
    big = "9" * 5000
    good = [json.dumps(r) for r in rows(12)]
    bad = f'{{"problem": "p", "answer": {big}}}'
    path = tmp_path / f"in.{fmt}"
    path.write_text("[" + ",".join(good + [bad]) + "]" if fmt == "json" else "\n".join(good + [bad]) + "\n")
    with pytest.raises(InvalidRowsError) as e:
        convert(path, tmp_path / "out")
    (err,) = e.value.errors
    assert err.row == 13 and err.key == "answer" and "integer of 5000 digits" in str(err)
    report = convert(path, tmp_path / "out", skip_invalid=True)
    assert report.rows_in == 13 and len(report.rejected) == 1 and report.train_rows + report.test_rows == 12
    r = run("--json_path", str(path), "--output_dir", str(tmp_path / "cli"))
    assert r.returncode == 2 and any("integer of 5000 digits" in ln for ln in _stderr_lines(r))


def test_a_huge_integer_in_a_field_nobody_reads_does_not_reject_the_row(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(
        "\n".join([json.dumps(r) for r in rows(11)] + ['{"problem": "p", "answer": "1", "id": ' + "7" * 6000 + "}"])
    )
    report = convert(path, tmp_path / "out")
    assert report.rows_in == 12 and not report.rejected


def test_a_field_longer_than_the_limit_is_a_row_error_with_the_flag_named(tmp_path):
    path = tmp_path / "in.json"
    long_row = {"problem": "x" * (DEFAULT_MAX_FIELD_CHARS + 1), "answer": "1"}
    path.write_text(json.dumps(rows(12) + [long_row]))
    with pytest.raises(InvalidRowsError) as e:
        convert(path, tmp_path / "out")
    (err,) = e.value.errors
    assert (
        err.key == "problem"
        and f"more than the {DEFAULT_MAX_FIELD_CHARS}" in str(err)
        and "--max-field-chars" in str(err)
    )
    report = convert(path, tmp_path / "out", max_field_chars=DEFAULT_MAX_FIELD_CHARS + 1)
    assert not report.rejected
    r = run(
        "--json_path", str(path), "--output_dir", str(tmp_path / "cli"), "--max-field-chars", "10", "--skip-invalid"
    )
    assert r.returncode == 2  # every row has a field longer than 10: too few rows left to split
    r = run("--json_path", str(path), "--output_dir", str(tmp_path / "cli2"), "--max-field-chars", "0")
    assert r.returncode == 2 and "--max-field-chars" in _stderr_lines(r)[-1]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_only_a_regular_file_is_read_and_nothing_blocks(tmp_path, kind):
    path = tmp_path / "in.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    with pytest.raises(InputFileError, match="not a regular file") as e:
        convert(path, tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    r = run("--json_path", str(path), "--output_dir", str(tmp_path / "cli"))
    assert r.returncode == 2 and len(_stderr_lines(r)) == 1


def test_a_non_utf8_template_is_one_line(tmp_path):
    with pytest.raises(TemplateError, match="not UTF-8 text \\(byte 0xff at character 5\\)"):
        resolve_template("Hey \udcff {problem}")
    path = tmp_path / "in.json"
    path.write_text(json.dumps(rows(12)))
    r = run("--json_path", str(path), "--output_dir", str(tmp_path / "out"), b"--template", b"Solve \xff {problem}")
    (line,) = _stderr_lines(r)
    assert r.returncode == 2 and "--template: not UTF-8 text" in line
    assert not (tmp_path / "out").exists()


# ---- temp files and modes ------------------------------------------------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_killed_runs_temp_files_are_cleaned_and_only_those(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    host, tmp = host_tag(), ".verl_patches-tmp-0123456789abcdef"
    stale = [f"{tmp}.{_dead_pid()}@{host}.train.parquet", f"{tmp}.{_dead_pid()}@{host}.{parquet_io.MARKER}"]
    alive = f"{tmp}.{os.getppid()}@{host}.train.parquet"  # a running process's: may be writing
    other_host = f"{tmp}.{_dead_pid()}@elsewhere.test.parquet"  # on shared storage: not ours to judge
    unowned = f"{tmp}.train.parquet"  # a temp without its writer's pid: whose it is cannot be told
    # a user's files, whatever they look like (the old mkstemp pattern is a name a user may have chosen too)
    foreign = ["notes.tmp", ".train.parquet.bak", "x.parquet.12345678.tmp", ".test.parquet.k3j_9xq2.tmp", unowned]
    for name in stale + [alive, other_host] + foreign:
        (out / name).write_bytes(b"partial")
    path = tmp_path / "in.json"
    path.write_text(json.dumps(rows(20)))
    convert(path, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [alive, other_host, *foreign, "test.parquet", "train.parquet"]
    )


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_output_mode_follows_the_umask(tmp_path, umask):
    path = tmp_path / "in.json"
    path.write_text(json.dumps(rows(20)))
    old = os.umask(umask)
    try:
        convert(path, tmp_path / "out")
    finally:
        os.umask(old)
    for name in ("train.parquet", "test.parquet"):
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


# ---- 8. property: arbitrary bytes as the input file ------------------------------------------------------

_records = st.dictionaries(
    st.sampled_from(["problem", "answer", "solution", "id"]),
    st.text(max_size=12) | st.integers() | st.none() | st.lists(st.integers(), max_size=2) | st.just("x" * 50),
    max_size=4,
)
_inputs = (
    st.binary(max_size=400)
    | st.lists(_records, max_size=14).map(lambda rs: json.dumps(rs).encode())
    | st.lists(_records, max_size=14).map(lambda rs: "\n".join(json.dumps(r) for r in rs).encode())
    | st.builds(
        lambda rs, cut, junk: json.dumps(rs).encode()[:cut] + junk,
        st.lists(_records, max_size=8),
        st.integers(0, 300),
        st.binary(max_size=8),
    )
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_inputs, skip_invalid=st.booleans())
def test_property_any_bytes_convert_or_refuse_in_one_line_inside_the_output_folder(
    tmp_path_factory, data, skip_invalid
):
    root = tmp_path_factory.mktemp("p")
    path = root / "in.json"
    path.write_bytes(data)
    out = root / "out"
    try:
        report = convert(path, out, skip_invalid=skip_invalid, max_field_chars=40)
    except InvalidRowsError as e:
        assert not skip_invalid and e.errors and all("\n" not in str(err) for err in e.errors)
        assert {p.name for p in root.iterdir()} == {"in.json"}
        return
    except DeepscalerInputError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        assert {p.name for p in root.iterdir()} == {"in.json"}
        return
    assert report.rows_in == report.train_rows + report.test_rows + len(report.rejected)
    assert all("\n" not in str(err) for err in report.rejected)
    assert {p.name for p in root.iterdir()} == {"in.json", "out"}
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]
    assert pq.read_table(out / "train.parquet").num_rows == report.train_rows
