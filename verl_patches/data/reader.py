"""Read deepscaler records from a JSON array or JSON Lines, remembering where each record starts.

Invalid UTF-8 is decoded with `surrogateescape`, so one bad byte spoils only the record it sits in
(validation reports it with its line and column) instead of the whole file. An integer longer than Python's
int-string limit (4300 digits) is kept as a `TooLongInteger` marker, which validation reports for its row,
instead of raising out of the JSON parser. Only a regular file is read (a FIFO would block the reader).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_patches.base.regular_file import FileRefused, read_regular_file
from verl_patches.data.errors import InputFileError, RowError

_WHITESPACE = re.compile(r"[ \t\n\r]*")
MAX_INPUT_BYTES = 4 << 30  # DeepScaleR is about 40 MB; a file beyond this is not a data set for one host
_INT_DIGITS_LIMIT = 4300  # Python's default int-string conversion limit (sys.get_int_max_str_digits)


@dataclass(frozen=True)
class TooLongInteger:
    """A JSON integer with more digits than Python converts; a record holding one where a field is read is
    rejected by name (no deepscaler field is a number)."""

    digits: int

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(text: str) -> int | TooLongInteger:
    digits = len(text.lstrip("-"))
    return TooLongInteger(digits) if digits > _INT_DIGITS_LIMIT else int(text)


@dataclass(frozen=True)
class RawRecord:
    row: int
    line: int
    value: Any
    text_span: tuple[int, int]  # where the record sits in the decoded text (for byte errors)


@dataclass
class ReadResult:
    path: Path
    input_format: str  # "json" or "jsonl"
    text: str
    has_undecodable_bytes: bool  # some bytes were not UTF-8 (kept as lone surrogates in text)
    records: list[RawRecord] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)  # JSON Lines records that are not JSON

    @property
    def rows_in(self) -> int:
        return len(self.records) + len(self.errors)


class _Lines:
    """Offset -> (line, column), both 1-based."""

    def __init__(self, text: str):
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def locate(self, offset: int) -> tuple[int, int]:
        index = bisect.bisect_right(self._starts, offset) - 1
        return index + 1, offset - self._starts[index] + 1


def _decode(data: bytes) -> tuple[str, bool]:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="surrogateescape"), True


def _read_array(path: Path, text: str, start: int, lines: _Lines, result: ReadResult) -> None:
    decoder = json.JSONDecoder(parse_int=_parse_int)
    pos = _WHITESPACE.match(text, start + 1).end()
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            try:
                value, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                line, col = lines.locate(exc.pos)
                raise InputFileError(
                    f"{path}:{line}:{col}: malformed JSON in row {len(result.records) + 1}: {exc.msg}"
                ) from None
            except RecursionError:
                line, col = lines.locate(pos)
                raise InputFileError(
                    f"{path}:{line}:{col}: row {len(result.records) + 1} is nested too deeply to be a deepscaler record"
                ) from None
            except ValueError as exc:  # any other refusal of the JSON parser: still one line
                line, col = lines.locate(pos)
                raise InputFileError(
                    f"{path}:{line}:{col}: row {len(result.records) + 1} is not JSON a converter "
                    f"can read ({str(exc)[:120]})"
                ) from None
            line, _ = lines.locate(pos)
            result.records.append(RawRecord(len(result.records) + 1, line, value, (pos, end)))
            pos = _WHITESPACE.match(text, end).end()
            if text.startswith(",", pos):
                pos = _WHITESPACE.match(text, pos + 1).end()
                continue
            if text.startswith("]", pos):
                pos += 1
                break
            line, col = lines.locate(pos)
            found = repr(text[pos]) if pos < len(text) else "end of file"
            raise InputFileError(
                f"{path}:{line}:{col}: malformed JSON after row {len(result.records)}: "
                f"expected ',' or ']', found {found}"
            )
    rest = _WHITESPACE.match(text, pos).end()
    if rest != len(text):
        line, col = lines.locate(rest)
        raise InputFileError(f"{path}:{line}:{col}: unexpected data after the closing ']' of the JSON array")


def _read_lines(path: Path, text: str, result: ReadResult) -> None:
    offset = 0
    for line_number, line in enumerate(text.split("\n"), start=1):
        span = (offset, offset + len(line))
        offset += len(line) + 1
        if not line.strip():
            continue
        row = result.rows_in + 1
        try:
            value = json.loads(line, parse_int=_parse_int)
        except json.JSONDecodeError as exc:
            result.errors.append(
                RowError(path, row, line_number, None, f"malformed JSON at column {exc.colno}: {exc.msg}")
            )
            continue
        except RecursionError:
            result.errors.append(RowError(path, row, line_number, None, "nested too deeply to be a deepscaler record"))
            continue
        except ValueError as exc:  # any other refusal of the JSON parser: still a row error
            result.errors.append(RowError(path, row, line_number, None, f"not readable JSON ({str(exc)[:120]})"))
            continue
        result.records.append(RawRecord(row, line_number, value, span))


def read_records(path: str | Path) -> ReadResult:
    """All records of a deepscaler file; JSON Lines syntax errors are per-row, JSON array ones fatal."""
    path = Path(path)
    try:
        data = read_regular_file(path, max_bytes=MAX_INPUT_BYTES)
    except FileRefused as exc:
        raise InputFileError(str(exc)) from None
    text, undecodable = _decode(data)
    start = _WHITESPACE.match(text).end()
    if start == len(text):
        raise InputFileError(f"{path}: the file is empty")
    lines = _Lines(text)
    if text[start] == "[":
        result = ReadResult(path, "json", text, undecodable)
        _read_array(path, text, start, lines, result)
        if not result.records:
            raise InputFileError(f"{path}: the JSON array is empty")
        return result
    if text[start] == "{":
        result = ReadResult(path, "jsonl", text, undecodable)
        _read_lines(path, text, result)
        if not result.records and _is_single_object(text):
            raise InputFileError(
                f"{path}: a single JSON object spread over several lines; "
                "expected a JSON array of objects or JSON Lines"
            )
        return result
    line, col = lines.locate(start)
    raise InputFileError(
        f"{path}:{line}:{col}: expected a JSON array ('[') or JSON Lines objects ('{{'), found {text[start]!r}"
    )


def _is_single_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text, parse_int=_parse_int), dict)
    except (ValueError, RecursionError):
        return False


_UNDECODABLE = re.compile("[\udc80-\udcff]")


def undecodable_byte(text: str, span: tuple[int, int]) -> tuple[int, int] | None:
    """(offset, byte value) of the first byte in span that was not valid UTF-8, if any."""
    match = _UNDECODABLE.search(text, span[0], span[1])
    return None if match is None else (match.start(), ord(match.group()) - 0xDC00)
