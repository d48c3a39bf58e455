"""`python verl_patches/scripts/json_to_parquet.py ...` from the repo root, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "verl_patches/scripts/json_to_parquet.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def rows(n: int) -> list[dict]:
    return [{"problem": f"Compute {i} * 3.", "answer": str(3 * i), "solution": "multiply"} for i in range(n)]


def test_help():
    result = run("--help")
    assert result.returncode == 0
    for flag in ("--json_path", "--output_dir", "--train_data_ratio", "--seed", "--template", "--skip-invalid"):
        assert flag in result.stdout


def test_converts_and_prints_the_row_accounting(tmp_path):
    source = tmp_path / "deepscaler.json"
    source.write_text(json.dumps(rows(30)))
    result = run(
        "--json_path", str(source), "--output_dir", str(tmp_path / "out"), "--train_data_ratio", "0.8", "--seed", "5"
    )
    assert result.returncode == 0, result.stderr
    assert "rows in: 30 = train 24 + test 6 + rejected 0" in result.stdout
    assert pq.read_table(tmp_path / "out" / "train.parquet").num_rows == 24


def test_invalid_rows_exit_2_with_named_rows_and_write_nothing(tmp_path):
    data = rows(10)
    data[4] = {"problem": "p", "answer": 7}
    data[8] = {"problem": "q"}
    source = tmp_path / "bad.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in data))
    result = run("--json_path", str(source), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert f"{source}:5: row 5: answer: must be a string, found int 7" in result.stderr
    assert f"{source}:9: row 9: answer: missing" in result.stderr
    assert "nothing written" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()

    result = run("--json_path", str(source), "--output_dir", str(tmp_path / "out"), "--skip-invalid")
    assert result.returncode == 0
    assert "rows in: 10 = train 7 + test 1 + rejected 2" in result.stdout
    assert "rejected:" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train_data_ratio", "1"], "argument --train_data_ratio: must be above 0 and below 1, got 1"),
        (["--train_data_ratio", "0"], "argument --train_data_ratio: must be above 0 and below 1, got 0"),
        (["--train_data_ratio", "abc"], "argument --train_data_ratio: expected a finite decimal number, got 'abc'"),
        (["--train_data_ratio", "nan"], "argument --train_data_ratio: expected a finite decimal number, got 'nan'"),
        (["--template", "nonsense"], "unknown template 'nonsense'"),
    ],
)
def test_bad_options_are_one_clear_line(tmp_path, args, message):
    source = tmp_path / "in.json"
    source.write_text(json.dumps(rows(5)))
    result = run("--json_path", str(source), "--output_dir", str(tmp_path / "out"), *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_malformed_json_names_line_and_column(tmp_path):
    source = tmp_path / "in.json"
    source.write_text('[\n  {"problem": "p", "answer": "1"},\n  {"problem": "q", "answer": "2",}\n]')
    result = run("--json_path", str(source), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert f"error: {source}:3:34: malformed JSON in row 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_unwritable_output_is_one_clear_line(tmp_path):
    source = tmp_path / "in.json"
    source.write_text(json.dumps(rows(5)))
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run("--json_path", str(source), "--output_dir", str(blocker / "out"))
    assert result.returncode == 1  # not the input's fault: the output could not be written
    assert "error: cannot write" in result.stderr and "Traceback" not in result.stderr


def test_progress_is_shown_for_large_inputs(tmp_path):
    source = tmp_path / "big.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in rows(6000)))
    result = run("--json_path", str(source), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 0
    assert "validating big.jsonl" in result.stderr and "6000/6000" in result.stderr
    quiet = run("--json_path", str(source), "--output_dir", str(tmp_path / "out"), "--no-progress")
    assert "validating" not in quiet.stderr


def test_bad_input_exits_2_as_the_weight_tools_do(tmp_path):
    """One convention for the data and weight tools: 2 is bad usage or input (nothing written), 0 is done."""
    missing = tmp_path / "absent.json"
    data = run("--json_path", str(missing), "--output_dir", str(tmp_path / "out"))
    weights = subprocess.run(
        [
            sys.executable,
            "verl_patches/scripts/make_config.py",
            "--from",
            str(tmp_path / "absent"),
            "--out",
            str(tmp_path / "cfg"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (data.returncode, weights.returncode) == (2, 2), (data.stderr, weights.stderr)
    for p in (data, weights):
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()


def test_another_python_without_pyarrow_is_one_line_exit_2(tmp_path):
    """README's command run by an interpreter that lacks requirements.txt's packages (a bare `python`): the tool
    names the interpreter and the module instead of ending in a traceback. A fake pyarrow that fails as an absent
    one does stands in for that interpreter."""
    fake = tmp_path / "site"
    (fake / "pyarrow").mkdir(parents=True)
    (fake / "pyarrow" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyarrow'\", name='pyarrow')\n"
    )
    source = tmp_path / "in.json"
    source.write_text(json.dumps(rows(5)))
    env = {**os.environ, "PYTHONPATH": str(fake)}
    p = subprocess.run(
        [sys.executable, SCRIPT, "--json_path", str(source), "--output_dir", str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (line,) = p.stderr.strip().splitlines()
    assert p.returncode == 2 and "json_to_parquet.py: this Python" in line and "no module 'pyarrow'" in line
    assert ".venv/bin/python" in line and not (tmp_path / "out").exists()
