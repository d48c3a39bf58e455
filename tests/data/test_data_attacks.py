"""Attacks on the data converter (issue 18): finished outputs replaced without asking, and input nested
deeply enough to overflow the stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl_patches.data.convert import convert
from verl_patches.data.errors import InputFileError, InvalidRowsError, OutputExistsError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "verl_patches/scripts/json_to_parquet.py"


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(start, start + n)]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_finished_outputs_are_not_replaced_without_overwrite(tmp_path):
    out = tmp_path / "out"
    first = tmp_path / "a.json"
    first.write_text(json.dumps(rows(30)))
    assert run("--json_path", str(first), "--output_dir", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    second = tmp_path / "b.json"
    second.write_text(json.dumps(rows(10, start=100)))
    result = run("--json_path", str(second), "--output_dir", str(out))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "train.parquet: already exists" in result.stderr
    assert "--overwrite" in result.stderr and "Traceback" not in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    result = run("--json_path", str(second), "--output_dir", str(out), "--overwrite")
    assert result.returncode == 0, result.stderr
    assert pq.read_table(out / "train.parquet").num_rows + pq.read_table(out / "test.parquet").num_rows == 10


def test_a_foreign_file_with_an_output_name_is_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "test.parquet").write_text("someone else's file")
    source = tmp_path / "in.json"
    source.write_text(json.dumps(rows(10)))
    with pytest.raises(OutputExistsError, match="test.parquet"):
        convert(source, out)
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet"]
    assert (out / "test.parquet").read_text() == "someone else's file"


def test_own_output_interrupted_between_the_renames_is_finished_without_asking(tmp_path, monkeypatch):
    out = tmp_path / "out"
    source = tmp_path / "in.json"
    source.write_text(json.dumps(rows(20)))
    real_replace = os.replace
    renamed = []

    def crash_after_the_first_output(src, dst):
        if str(dst).endswith(".parquet") and renamed:
            raise KeyboardInterrupt
        if str(dst).endswith(".parquet"):
            renamed.append(dst)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_after_the_first_output)  # the rename of base.atomic_write.commit
    with pytest.raises(KeyboardInterrupt):
        convert(source, out)
    monkeypatch.setattr(os, "replace", real_replace)
    assert (out / "train.parquet").exists() and not (out / "test.parquet").exists()
    report = convert(source, out)  # the same command again: resumes without --overwrite
    assert report.train_rows + report.test_rows == 20
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]
    with pytest.raises(OutputExistsError):  # now finished: protected again
        convert(source, out)


@pytest.mark.parametrize("depth", [100_000, 950])
def test_deeply_nested_json_array_is_one_clear_error(tmp_path, depth):
    path = tmp_path / "deep.json"
    nested = "[" * depth + "]" * depth
    path.write_text(f'[{{"problem": "p", "answer": {nested}}}, {{"problem": "q", "answer": "1"}}]')
    try:
        convert(path, tmp_path / "out")
    except InputFileError as e:
        assert "nested too deeply" in str(e) and str(path) in str(e)
    except InvalidRowsError as e:
        assert "answer" in str(e.errors[0]) and "must be a string" in str(e.errors[0])
    assert not (tmp_path / "out").exists()


def test_deeply_nested_json_lines_row_is_a_row_error(tmp_path):
    path = tmp_path / "deep.jsonl"
    nested = "[" * 100_000 + "]" * 100_000
    lines = [json.dumps(r) for r in rows(5)] + [f'{{"problem": "p", "answer": {nested}}}']
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidRowsError) as e:
        convert(path, tmp_path / "out")
    assert "row 6" in str(e.value.errors[0]) and "nested too deeply" in str(e.value.errors[0])
    result = run("--json_path", str(path), "--output_dir", str(tmp_path / "cli"))
    assert result.returncode == 2 and "Traceback" not in result.stderr and "nested too deeply" in result.stderr
