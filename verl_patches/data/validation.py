"""One raw record -> a `DeepscalerExample`, or a `RowError` naming the row and key at fault."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from pathlib import Path

from verl_patches.data.errors import RowError
from verl_patches.data.reader import RawRecord, TooLongInteger, undecodable_byte

REQUIRED_KEYS = ("problem", "answer")
OPTIONAL_KEYS = ("solution",)
# Characters per field: DeepScaleR's longest field is a few thousand characters; a field beyond this is not a
# math problem, and every copy of it (decoded text, record, row, parquet) would cost memory
DEFAULT_MAX_FIELD_CHARS = 100_000
MAX_FIELD_FLAG = "--max-field-chars"


@dataclass(frozen=True)
class DeepscalerExample:
    row: int
    line: int
    problem: str
    answer: str
    solution: str


def _has_lone_surrogate(value: str) -> bool:
    # JSON "\ud800" escapes decode to lone surrogates, which cannot be written as UTF-8.
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in value) if not value.isascii() else False


def _type_name(value: object) -> str:
    return "integer" if isinstance(value, TooLongInteger) else type(value).__name__


def validate_record(
    path: Path, record: RawRecord, text: str | None = None, max_field_chars: int = DEFAULT_MAX_FIELD_CHARS
) -> DeepscalerExample | RowError:
    """Check one record; text is the decoded file, given when it holds undecodable bytes."""

    def error(key: str | None, message: str) -> RowError:
        return RowError(path, record.row, record.line, key, message)

    value = record.value
    if not isinstance(value, dict):
        return error(None, f"expected a JSON object, found {type(value).__name__}")
    if text is not None:
        bad = undecodable_byte(text, record.text_span)
        if bad is not None:
            offset, byte = bad
            line = record.line + text.count("\n", record.text_span[0], offset)
            column = offset - (text.rfind("\n", 0, offset) + 1) + 1
            return RowError(path, record.row, line, None, f"non-UTF-8 byte 0x{byte:02x} at column {column}")
    fields: dict[str, str] = {}
    for key in REQUIRED_KEYS:
        if key not in value or value[key] is None:
            return error(key, "missing")
        if not isinstance(value[key], str):
            return error(key, f"must be a string, found {_type_name(value[key])} {json_repr(value[key])}")
        if not value[key].strip():
            return error(key, "empty")
        fields[key] = value[key].strip()
    solution = value.get("solution")
    if solution is not None and not isinstance(solution, str):
        return error("solution", f"must be a string, found {_type_name(solution)}")
    fields["solution"] = solution or ""
    for key, text_value in fields.items():
        if len(text_value) > max_field_chars:
            return error(
                key,
                f"{len(text_value)} characters, more than the {max_field_chars} a field may have "
                f"({MAX_FIELD_FLAG} raises the limit)",
            )
        if _has_lone_surrogate(text_value):
            return error(key, "contains an invalid Unicode escape (lone surrogate)")
    return DeepscalerExample(record.row, record.line, fields["problem"], fields["answer"], fields["solution"])


# Bounded depth and width: a value nested hundreds deep (still valid JSON) must not overflow the stack
# or build a huge string just to be named in an error message.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 3, 8, 4, 200, 200


def json_repr(value: object, limit: int = 40) -> str:
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
