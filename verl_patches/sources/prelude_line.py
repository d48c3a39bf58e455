"""Insert, find and strip the one line that activates our patches in verl's Megatron worker module.

The position is found by parsing: after the module docstring and any `from __future__` imports, before
the first other statement, so the prelude runs before torch, Megatron and the verl modules it shims.
"""

from __future__ import annotations

import ast


class PreludeError(RuntimeError):
    pass


def insertion_lineno(source: str, filename: str = "<module>") -> int:
    """0-based index of the line before which the prelude goes."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise PreludeError(f"{filename}:{e.lineno}: cannot parse to place the prelude line: {e.msg}") from None
    body = list(tree.body)
    idx = 0
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(getattr(body[0], "value", None), ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        idx = 1
    while idx < len(body) and isinstance(body[idx], ast.ImportFrom) and body[idx].module == "__future__":
        idx += 1
    if idx < len(body):
        return body[idx].lineno - 1
    # Only a docstring (or nothing): append after the last statement.
    return body[-1].end_lineno if body else 0


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def find(data: bytes, line: str) -> list[int]:
    """0-based line numbers where exactly the prelude line stands."""
    want = line.encode()
    return [i for i, ln in enumerate(_lines(data)) if ln.rstrip(b"\r\n") == want]


def insert(data: bytes, line: str, filename: str = "<module>") -> bytes:
    """Return `data` with the prelude line in place; unchanged if it is already where it belongs."""
    stripped = strip(data, line)
    at = insertion_lineno(stripped.decode("utf-8"), filename)
    lines = _lines(stripped)
    if at < len(lines) or not lines or lines[-1].endswith(b"\n"):
        lines.insert(at, line.encode() + b"\n")
    else:  # file without a trailing newline: keep it that way, so strip() can restore the exact bytes
        lines.append(b"\n" + line.encode())
    return b"".join(lines)


def strip(data: bytes, line: str) -> bytes:
    """Remove every occurrence of the prelude line: the pristine upstream content."""
    hits = set(find(data, line))
    if not hits:
        return data
    lines = _lines(data)
    kept = [ln for i, ln in enumerate(lines) if i not in hits]
    if len(lines) - 1 in hits and not lines[-1].endswith(b"\n") and kept:
        kept[-1] = kept[-1].rstrip(b"\r\n")  # the line was appended to a file without a final newline
    return b"".join(kept)


def is_in_place(data: bytes, line: str, filename: str = "<module>") -> bool:
    hits = find(data, line)
    if len(hits) != 1:
        return False
    return insert(data, line, filename) == data
