"""JSON as checkpoint files hold it: UTF-8, no NaN/Infinity, no duplicate keys, bounded nesting and numbers.

``json.loads`` alone takes ``NaN``, keeps the last of two equal keys, raises ValueError past 4300 digits
and RecursionError on deep nesting; here each is one `StrictJsonError` line naming the file (and line).
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64
MAX_NUMBER_CHARS = 40  # far beyond any step, size or layout number; far below Python's digit limit


class StrictJsonError(ValueError):
    """Bytes that are not strict JSON; one line naming where and why."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise StrictJsonError(f"duplicate key {k[:60]!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not a JSON number")


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise StrictJsonError(f"a number of {len(text)} digits")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise StrictJsonError(f"a number of {len(text)} characters")
    return float(text)


def _depth_ok(text: str) -> bool:
    """Nesting never deeper than MAX_DEPTH (brackets inside strings count too: a conservative bound)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:  # the common case, at C speed
        return True
    depth = 0
    for c in text:
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif c in "]}":
            depth -= 1
    return True


def loads_strict(data: bytes | str, where: str) -> Any:
    """The JSON value of ``data``; StrictJsonError naming ``where`` for anything else."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise StrictJsonError(f"{where}: not UTF-8 (byte {err.start})") from None
    else:
        text = data
    if not _depth_ok(text):
        raise StrictJsonError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(
            text, object_pairs_hook=_pairs, parse_constant=_no_constant, parse_int=_int, parse_float=_float
        )
    except json.JSONDecodeError as err:
        raise StrictJsonError(f"{where}: line {err.lineno}: not valid JSON ({err.msg})") from None
    except StrictJsonError as err:
        raise StrictJsonError(f"{where}: {err}") from None
    except (ValueError, RecursionError) as err:
        raise StrictJsonError(f"{where}: not valid JSON ({type(err).__name__}: {str(err)[:80]})") from None
