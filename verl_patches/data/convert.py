"""`convert(json_path, output_dir, ...)`: deepscaler JSON/JSONL -> `train.parquet` + `test.parquet`.

Reads and validates every row first; only then, if nothing is invalid (or `skip_invalid`), writes
both files atomically. Rows in always equal train + test + rejected.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from verl_patches.base.atomic_write import remove_abandoned_temps
from verl_patches.data.errors import InvalidRowsError, RowError, SplitError
from verl_patches.data.parquet_io import check_outputs_free, write_tables_atomically
from verl_patches.data.reader import read_records
from verl_patches.data.rl_rows import VERL_RL_SCHEMA, verl_row
from verl_patches.data.split import plan_split
from verl_patches.data.templates import DEFAULT_TEMPLATE, resolve_template
from verl_patches.data.validation import DEFAULT_MAX_FIELD_CHARS, DeepscalerExample, validate_record

DEFAULT_TRAIN_RATIO = 0.9
DEFAULT_SEED = 42
TRAIN_FILE = "train.parquet"
TEST_FILE = "test.parquet"
# Below this many rows a progress bar is noise.
_PROGRESS_MIN_ROWS = 5000


@dataclass(frozen=True)
class DuplicateGroup:
    rows: tuple[int, ...]  # 1-based input rows sharing one problem text
    split: str
    conflicting_answers: bool


@dataclass
class ConversionReport:
    input_path: Path
    input_format: str
    output_dir: Path
    train_path: Path
    test_path: Path
    rows_in: int
    train_rows: int
    test_rows: int
    rejected: list[RowError] = field(default_factory=list)
    duplicates: list[DuplicateGroup] = field(default_factory=list)
    seed: int = DEFAULT_SEED
    train_ratio: float = DEFAULT_TRAIN_RATIO

    def summary(self) -> str:
        lines = [
            f"rows in: {self.rows_in} = train {self.train_rows} + test {self.test_rows} "
            f"+ rejected {len(self.rejected)}",
            f"wrote {self.train_path} and {self.test_path} (seed {self.seed}, train ratio {self.train_ratio})",
        ]
        if self.duplicates:
            conflicts = sum(d.conflicting_answers for d in self.duplicates)
            extra = sum(len(d.rows) - 1 for d in self.duplicates)
            lines.append(
                f"duplicates: {len(self.duplicates)} problems appear more than once ({extra} extra rows, "
                f"{conflicts} with different answers); each kept on one side only"
            )
        return "\n".join(lines)


def _validate_all(
    path: Path, records, text: str | None, progress: bool, max_field_chars: int = DEFAULT_MAX_FIELD_CHARS
) -> tuple[list[DeepscalerExample], list[RowError]]:
    examples: list[DeepscalerExample] = []
    errors: list[RowError] = []
    bar = tqdm(records, desc=f"validating {path.name}", unit="row", file=sys.stderr, disable=not progress)
    for record in bar:
        result = validate_record(path, record, text, max_field_chars)
        (examples if isinstance(result, DeepscalerExample) else errors).append(result)
    return examples, errors


def convert(
    json_path: str | Path,
    output_dir: str | Path,
    train_ratio: float = DEFAULT_TRAIN_RATIO,
    seed: int = DEFAULT_SEED,
    template: str = DEFAULT_TEMPLATE,
    skip_invalid: bool = False,
    progress: bool = False,
    overwrite: bool = False,
    max_field_chars: int = DEFAULT_MAX_FIELD_CHARS,
) -> ConversionReport:
    """Convert a deepscaler file; raises a `DeepscalerInputError` (nothing written) on bad input.

    `template` is a template name (`r1_zero`, `none`) or a text containing `{problem}`. Existing
    `train.parquet`/`test.parquet` are replaced only with `overwrite` (or when an interrupted earlier
    write left them half-done); otherwise `OutputExistsError` names the file before anything is read.
    A row with a field longer than `max_field_chars` characters is invalid (named with its row). Temporary
    files a killed earlier run left in `output_dir` are removed first (only those: `parquet_io`).
    """
    if not 0.0 < train_ratio < 1.0:
        raise ValueError(f"train ratio must be in (0, 1), got {train_ratio}")
    if max_field_chars < 1:
        raise ValueError(f"max field length must be at least 1 character, got {max_field_chars}")
    template_text = resolve_template(template)
    path = Path(json_path)
    output_dir = Path(output_dir)
    targets = [output_dir / TRAIN_FILE, output_dir / TEST_FILE]
    check_outputs_free(targets, overwrite)  # before the (long) read: a refusal costs nothing
    remove_abandoned_temps(output_dir)
    read = read_records(path)
    show = progress and read.rows_in >= _PROGRESS_MIN_ROWS
    text = read.text if read.has_undecodable_bytes else None
    examples, errors = _validate_all(path, read.records, text, show, max_field_chars)
    errors = sorted(read.errors + errors, key=lambda e: e.row)
    if errors and not skip_invalid:
        raise InvalidRowsError(errors, read.rows_in)
    try:
        plan = plan_split([e.problem for e in examples], train_ratio, seed)
    except SplitError as e:
        raise SplitError(f"{path}: {e}") from None

    splits = {"train": plan.train, "test": plan.test}
    tables = {}
    for split, positions in splits.items():
        rows = [verl_row(examples[p], split, index, template_text) for index, p in enumerate(positions)]
        tables[output_dir / f"{split}.parquet"] = pa.Table.from_pylist(rows, schema=VERL_RL_SCHEMA)
    write_tables_atomically(tables, overwrite=overwrite)

    side = {p: "train" for p in plan.train} | {p: "test" for p in plan.test}
    duplicates = [
        DuplicateGroup(
            rows=tuple(examples[p].row for p in group),
            split=side[group[0]],
            conflicting_answers=len({examples[p].answer for p in group}) > 1,
        )
        for group in plan.duplicate_groups
    ]
    report = ConversionReport(
        input_path=path,
        input_format=read.input_format,
        output_dir=output_dir,
        train_path=output_dir / TRAIN_FILE,
        test_path=output_dir / TEST_FILE,
        rows_in=read.rows_in,
        train_rows=len(plan.train),
        test_rows=len(plan.test),
        rejected=errors,
        duplicates=duplicates,
        seed=seed,
        train_ratio=train_ratio,
    )
    assert report.rows_in == report.train_rows + report.test_rows + len(report.rejected)
    return report
