"""The deepscaler converter's public API: schema, split, determinism, duplicates, bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl_patches.data.convert import convert
from verl_patches.data.errors import InputFileError, InvalidRowsError, SplitError
from verl_patches.data.rl_rows import VERL_RL_SCHEMA
from verl_patches.data.templates import TEMPLATES


def rows(n: int, start: int = 0) -> list[dict]:
    return [
        {"problem": f"What is {i} + {i}?", "answer": str(2 * i), "solution": f"{i} + {i} = {2 * i}"}
        for i in range(start, start + n)
    ]


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data, indent=2))
    return path


def write_jsonl(path: Path, data: list) -> Path:
    path.write_text("\n".join(json.dumps(d) for d in data) + "\n")
    return path


def read(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_ten_rows_give_nine_and_one_in_verl_schema(tmp_path):
    report = convert(write_json(tmp_path / "in.json", rows(10)), tmp_path / "out")
    train, test = read(report.train_path), read(report.test_path)
    assert (len(train), len(test)) == (9, 1)
    assert pq.read_schema(report.train_path).equals(VERL_RL_SCHEMA, check_metadata=False)
    row = train[0]
    assert row["data_source"] == "deepscaler" and row["ability"] == "math"
    assert row["reward_model"]["style"] == "rule"
    assert [m["role"] for m in row["prompt"]] == ["user"]
    problem = row["extra_info"]["problem"]
    assert row["prompt"][0]["content"] == TEMPLATES["r1_zero"].replace("{problem}", problem)
    assert "<think>" in row["prompt"][0]["content"] and "\\boxed{" in row["prompt"][0]["content"]
    source = rows(10)[row["extra_info"]["source_row"] - 1]
    assert (source["problem"], source["answer"], source["solution"]) == (
        problem,
        row["reward_model"]["ground_truth"],
        row["extra_info"]["solution"],
    )
    assert [r["extra_info"]["index"] for r in train] == list(range(9))
    assert {r["extra_info"]["split"] for r in train} == {"train"} and test[0]["extra_info"]["split"] == "test"


def test_split_is_shuffled_seeded_deterministic_and_disjoint(tmp_path):
    source = write_json(tmp_path / "in.json", rows(200))
    first = convert(source, tmp_path / "a", seed=7)
    again = convert(source, tmp_path / "b", seed=7)
    other = convert(source, tmp_path / "c", seed=8)
    assert first.train_path.read_bytes() == again.train_path.read_bytes()
    assert first.test_path.read_bytes() == again.test_path.read_bytes()
    order = [r["extra_info"]["source_row"] for r in read(first.train_path)]
    assert order != sorted(order), "the split must be shuffled, not the first 90 %"
    assert order != [r["extra_info"]["source_row"] for r in read(other.train_path)]
    train = {r["extra_info"]["problem"] for r in read(first.train_path)}
    test = {r["extra_info"]["problem"] for r in read(first.test_path)}
    assert not train & test and len(train | test) == 200
    assert (first.train_rows, first.test_rows) == (180, 20)


def test_duplicates_are_reported_and_kept_on_one_side(tmp_path):
    data = rows(40)
    data += [dict(data[3]), {**data[5], "problem": "  What is 5 +  5? "}, {**data[7], "answer": "15"}]
    report = convert(write_json(tmp_path / "in.json", data), tmp_path / "out", train_ratio=0.5, seed=3)
    assert report.rows_in == 43 == report.train_rows + report.test_rows
    assert sorted(d.rows for d in report.duplicates) == [(4, 41), (6, 42), (8, 43)]
    assert [d.conflicting_answers for d in sorted(report.duplicates, key=lambda d: d.rows)] == [False, False, True]
    for path in (report.train_path, report.test_path):
        for r in read(path):
            assert r["extra_info"]["split"] == path.stem
    sides = {}
    for path in (report.train_path, report.test_path):
        for r in read(path):
            sides.setdefault(" ".join(r["extra_info"]["problem"].split()), set()).add(path.stem)
    assert all(len(s) == 1 for s in sides.values())
    assert "duplicates: 3 problems" in report.summary()


def test_jsonl_with_bom_and_blank_lines(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r) for r in rows(5)).replace("\n", "\n\n").encode())
    report = convert(path, tmp_path / "out")
    assert report.input_format == "jsonl" and report.rows_in == 5


def test_template_none_and_custom(tmp_path):
    source = write_json(tmp_path / "in.json", rows(4))
    bare = read(convert(source, tmp_path / "bare", template="none").train_path)
    assert all(r["prompt"][0]["content"] == r["extra_info"]["problem"] for r in bare)
    custom = read(convert(source, tmp_path / "custom", template="Q: {problem}\nA:").train_path)
    assert all(r["prompt"][0]["content"] == f"Q: {r['extra_info']['problem']}\nA:" for r in custom)


def test_latex_braces_in_problems_survive_the_template(tmp_path):
    data = [{"problem": "Find $\\frac{1}{2} + {x}$ where {problem} is literal", "answer": "\\frac{1}{2}"}] + rows(3)
    report = convert(write_json(tmp_path / "in.json", data), tmp_path / "out", train_ratio=0.75, seed=0)
    contents = [r["prompt"][0]["content"] for p in (report.train_path, report.test_path) for r in read(p)]
    assert any("$\\frac{1}{2} + {x}$ where {problem} is literal" in c for c in contents)


BAD_ROWS = [
    ({"answer": "1"}, "problem: missing"),
    ({"problem": "  ", "answer": "1"}, "problem: empty"),
    ({"problem": "p", "answer": 42}, "answer: must be a string, found int 42"),
    ({"problem": "p", "answer": ""}, "answer: empty"),
    ({"problem": "p", "answer": "1", "solution": 3}, "solution: must be a string"),
    (["not", "an", "object"], "expected a JSON object, found list"),
    ({"problem": "p\ud800", "answer": "1"}, "problem: contains an invalid Unicode escape"),
]


@pytest.mark.parametrize("bad, message", BAD_ROWS)
def test_bad_row_is_named_and_nothing_is_written(tmp_path, bad, message):
    data = rows(5)
    data.insert(2, bad)
    source = write_jsonl(tmp_path / "in.jsonl", data)
    with pytest.raises(InvalidRowsError) as caught:
        convert(source, tmp_path / "out")
    (error,) = caught.value.errors
    assert (error.row, error.line) == (3, 3)
    assert message in str(error) and str(source) in str(error)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad, message", BAD_ROWS)
def test_skip_invalid_converts_the_rest_and_accounts_for_every_row(tmp_path, bad, message):
    data = rows(5)
    data.insert(2, bad)
    report = convert(write_jsonl(tmp_path / "in.jsonl", data), tmp_path / "out", skip_invalid=True)
    assert report.rows_in == 6 and len(report.rejected) == 1
    assert report.train_rows + report.test_rows == 5
    assert "rejected 1" in report.summary()


def test_non_utf8_byte_is_located(tmp_path):
    path = tmp_path / "in.json"
    payload = json.dumps(rows(3), indent=1).encode().replace(b"What is 1 + 1?", b"What is 1 \xff 1?")
    path.write_bytes(payload)
    with pytest.raises(InvalidRowsError) as caught:
        convert(path, tmp_path / "out")
    (error,) = caught.value.errors
    line = payload[: payload.index(b"\xff")].count(b"\n") + 1
    assert error.row == 2 and error.line == line and "non-UTF-8 byte 0xff" in str(error)
    report = convert(path, tmp_path / "out", skip_invalid=True)
    assert report.train_rows + report.test_rows == 2


def test_malformed_jsonl_line_is_a_row_error(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps(r) for r in rows(4)]
    lines.insert(1, '{"problem": "p", "answer": }')
    path.write_text("\n".join(lines))
    with pytest.raises(InvalidRowsError) as caught:
        convert(path, tmp_path / "out")
    assert "in.jsonl:2: row 2: malformed JSON at column 28" in str(caught.value.errors[0])
    assert convert(path, tmp_path / "out", skip_invalid=True).rows_in == 5


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "the file is empty"),
        (b"  \n ", "the file is empty"),
        (b"[]", "the JSON array is empty"),
        (
            b'[{"problem": "p", "answer": "1"},\n {"problem": "q" "answer": "2"}]',
            ":2:18: malformed JSON in row 2: Expecting ',' delimiter",
        ),
        (b'[{"problem": "p", "answer": "1"} {"problem": "q"}]', ":1:34: malformed JSON after row 1"),
        (b'[{"problem": "p", "answer": "1"}', "malformed JSON after row 1: expected ',' or ']', found end of file"),
        (b'[{"problem": "p", "answer": "1"}] extra', ":1:35: unexpected data after"),
        (b'"just a string"', ":1:1: expected a JSON array"),
        (b'{\n "problem": "p",\n "answer": "1"\n}', "a single JSON object"),
    ],
)
def test_file_level_errors_name_file_line_and_column(tmp_path, content, message):
    path = tmp_path / "in.json"
    path.write_bytes(content)
    with pytest.raises(InputFileError) as caught:
        convert(path, tmp_path / "out", skip_invalid=True)
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputFileError, match="nope.json: no such file"):
        convert(tmp_path / "nope.json", tmp_path / "out")


def test_one_distinct_problem_cannot_be_split(tmp_path):
    with pytest.raises(SplitError, match="at least 2 distinct"):
        convert(write_json(tmp_path / "in.json", [rows(1)[0]] * 3), tmp_path / "out")


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.1, 1.5])
def test_ratio_must_be_inside_zero_one(tmp_path, ratio):
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        convert(write_json(tmp_path / "in.json", rows(5)), tmp_path / "out", train_ratio=ratio)


def test_existing_outputs_are_replaced_whole_with_overwrite_and_no_temp_files_remain(tmp_path):
    out = tmp_path / "out"
    convert(write_json(tmp_path / "a.json", rows(50)), out)
    report = convert(write_json(tmp_path / "b.json", rows(20, start=100)), out, overwrite=True)
    assert report.train_rows + report.test_rows == 20
    assert len(read(out / "train.parquet")) + len(read(out / "test.parquet")) == 20
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]


def test_a_failed_write_leaves_previous_outputs_untouched(tmp_path, monkeypatch):
    import verl_patches.data.parquet_io as parquet_io

    out = tmp_path / "out"
    convert(write_json(tmp_path / "a.json", rows(50)), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_write = parquet_io.pq.write_table
    calls = []

    def failing_write(table, where, *args, **kwargs):
        calls.append(where)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(table, where, *args, **kwargs)

    monkeypatch.setattr(parquet_io.pq, "write_table", failing_write)
    with pytest.raises(OSError):
        convert(write_json(tmp_path / "b.json", rows(20, start=100)), out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
