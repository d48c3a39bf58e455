"""What a published heartbeat must look like before the driver's watch uses it.

Heartbeats come from other processes through a shared key-value store: a damaged, truncated or foreign
value must not crash the driver's bounded wait (it would end the job with a traceback instead of a hang
report). `parse_heartbeat` returns the record, or one line saying which field is wrong; the watch then
treats that rank as silent and names the problem in its report.
"""

from __future__ import annotations

import json
from typing import Any

MAX_BYTES = 64 * 1024
_INT = "an integer"
_STR = "a string"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(1 << 62) < v < (1 << 62)


_TOP = {
    "beat": (_is_int, _INT, True),
    "activity": (_is_int, _INT, False),
    "rank": (_is_int, _INT, False),
    "pid": (_is_int, _INT, False),
    "started": (lambda v: v is None or _is_int(v), "an integer or null", False),
    "node": (lambda v: isinstance(v, str), _STR, False),
    "host": (lambda v: isinstance(v, str), _STR, False),
    "log": (lambda v: isinstance(v, str), _STR, False),
    "where": (lambda v: isinstance(v, str), _STR, False),
    "node_id": (lambda v: isinstance(v, str), _STR, False),
    "store": (lambda v: isinstance(v, str), _STR, False),
    "flight_recorder": (lambda v: isinstance(v, str), _STR, False),
    "age_s": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number", False),
}
_POS = {
    "marks": (_is_int, _INT, True),
    "call": (lambda v: isinstance(v, str), _STR, True),
    "step": (lambda v: v is None or _is_int(v), "an integer or null", True),
    "phase": (lambda v: isinstance(v, str), _STR, True),
    "unit": (lambda v: isinstance(v, str), _STR, False),
    "index": (lambda v: v is None or _is_int(v), "an integer or null", False),
    "total": (lambda v: v is None or _is_int(v), "an integer or null", False),
    "group": (_is_int, _INT, False),
    "coarse": (lambda v: isinstance(v, bool), "true or false", False),
}


def _check(obj: dict, fields: dict, prefix: str) -> str:
    for name, (ok, what, required) in fields.items():
        if name not in obj:
            if required:
                return f"{prefix}{name} is missing"
            continue
        if not ok(obj[name]):
            return f"{prefix}{name} must be {what}, got {str(obj[name])[:40]!r}"
    return ""


def parse_heartbeat(raw: Any) -> tuple[dict | None, str]:
    """(the record, '') for a well-formed heartbeat; (None, why) otherwise."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_BYTES:
            return None, f"{len(raw)} bytes, more than a heartbeat's {MAX_BYTES}"
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None, "not UTF-8"
    if not isinstance(raw, str):
        return None, f"not text ({type(raw).__name__})"
    if len(raw) > MAX_BYTES:
        return None, f"{len(raw)} characters, more than a heartbeat's {MAX_BYTES}"
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError) as err:
        return None, f"not JSON ({str(err)[:60]})"
    if not isinstance(record, dict):
        return None, f"not a JSON object ({type(record).__name__})"
    problem = _check(record, _TOP, "")
    if problem:
        return None, problem
    pos = record.get("pos")
    if not isinstance(pos, dict):
        return None, "pos must be an object"
    problem = _check(pos, _POS, "pos.")
    return (None, problem) if problem else (record, "")
