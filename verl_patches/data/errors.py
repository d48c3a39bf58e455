"""Errors of the deepscaler converter; every message names the file and, where known, line, row and key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RowError:
    path: Path
    row: int  # 1-based position of the record in the input (array element or non-blank line)
    line: int  # 1-based line where the record starts
    key: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}: row {self.row}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class DeepscalerInputError(Exception):
    """Base class: the input cannot be converted as asked; nothing has been written."""


class InputFileError(DeepscalerInputError):
    """The file as a whole is unusable (missing, empty, not JSON, malformed JSON array)."""


class InvalidRowsError(DeepscalerInputError):
    """Some rows are invalid and --skip-invalid was not given."""

    def __init__(self, errors: list[RowError], rows_in: int):
        self.errors = errors
        self.rows_in = rows_in
        super().__init__(f"{len(errors)} of {rows_in} rows are invalid; first: {errors[0]}")


class SplitError(DeepscalerInputError):
    """Too few valid rows (or distinct problems) to make a train and a test split."""


class OutputExistsError(DeepscalerInputError):
    """An output file exists (and is not this writer's own unfinished work) and --overwrite was not given."""
