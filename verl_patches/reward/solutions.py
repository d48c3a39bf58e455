"""Answers that name a variable or list several values: `x = 3`, `x \\in (1, 2)`, `x=1 or x=2`.

- One simple assignment (`x = 3`, `f(x) = x^2`, `a_1 = 5`) or membership (`x \\in [1, 2)`) stands for its
  right-hand side.
- Solutions joined by "or", "and", commas or semicolons, each a value or an assignment to the same
  variable (`x=1 or x=2`, `x = 1, 2`, `x_1 = 1, x_2 = 2`), become one comma list of the values. Items
  that are relations, or assignments to different variables (`x=1, y=2`, a system), are left alone.
- Only a top-level `=` makes an equation: the `=` of `\\sum_{k=1}` or `\\lim_{n=1}` is inside a group.

Everything here scans the text once per call with a bracket depth counter.
"""

from __future__ import annotations

import re

_SIMPLE_LHS = re.compile(
    r"\s*(?P<name>[A-Za-z]|\\[A-Za-z]+)(?P<sub>_(?:\{\s*[A-Za-z0-9]+\s*\}|[A-Za-z0-9]))?"
    r"(?P<call>\(\s*-?[A-Za-z0-9]+\s*\))?\s*"
)
_GREEK_OR_VARIABLE = re.compile(r"\\(?:alpha|beta|gamma|delta|theta|lambda|mu|phi|varphi|psi|omega|rho|sigma|tau)")
_RELATION = re.compile(r"<|>|\\(?:le|ge|leq|geq|lt|gt|ne|neq|approx|in|subset|subseteq|to|iff|implies)(?![A-Za-z])")
_ORDER = re.compile(r"<|>|\\(?:le|ge|leq|geq|lt|gt)(?![A-Za-z])")
_OR_WORDS = ("or", "and")
_OR_COMMANDS = ("\\lor", "\\vee")
_OPEN = "([{"
_CLOSE = ")]}"


def top_level_positions(text: str, token: str) -> list[int]:
    """Start indices of `token` outside every (), [], {} and \\{ \\} group."""
    if token not in text:
        return []
    found: list[int] = []
    depth = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "{}":
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if depth == 0 and text.startswith(token, i):
            found.append(i)
            i += len(token)
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        i += 1
    return found


def _equals_positions(text: str) -> list[int]:
    """Top-level `=` signs that are equalities (not part of `<=`, `>=`, `!=`, `==`)."""
    return [
        i
        for i in top_level_positions(text, "=")
        if (i == 0 or text[i - 1] not in "<>!=") and (i + 1 >= len(text) or text[i + 1] != "=")
    ]


def is_equation(text: str) -> bool:
    """Whether text has a top-level equality sign."""
    return bool(_equals_positions(text))


def _variable(lhs: str) -> str | None:
    """What an assignment's left side names: `x`; `x_1` -> `x` (indexed solutions of one unknown);
    `f(2)` -> `f(2)` (values at different points are different unknowns); None if not a variable."""
    match = _SIMPLE_LHS.fullmatch(lhs)
    if not match:
        return None
    name = match.group("name")
    if name.startswith("\\") and not _GREEK_OR_VARIABLE.fullmatch(name):
        return None  # `\pi = 3`, `\sin = ...`: a constant or function name is not a variable
    call = match.group("call")
    return name + re.sub(r"\s+", "", call) if call else name


def split_assignment(text: str) -> tuple[str | None, str]:
    """(variable, right side) for `x = 3` / `x \\in (1,2)`; (None, text) when text is no simple assignment."""
    equals = _equals_positions(text)
    if len(equals) == 1:
        lhs, rhs = text[: equals[0]], text[equals[0] + 1 :]
        if _ORDER.search(rhs) or _ORDER.search(lhs):
            return None, text
    else:
        members = top_level_positions(text, "\\in")
        members = [i for i in members if not text[i + 3 : i + 4].isalpha()]
        if equals or len(members) != 1:
            return None, text
        lhs, rhs = text[: members[0]], text[members[0] + 3 :]
    variable = _variable(lhs)
    if variable is None or not rhs.strip():
        return None, text
    return variable, rhs.strip()


def _split_items(text: str) -> list[str]:
    """Top-level items separated by commas, semicolons, the words "or"/"and", or \\lor / \\vee."""
    cuts: list[tuple[int, int]] = []
    for separator in (",", ";") + _OR_COMMANDS:
        cuts += [(i, i + len(separator)) for i in top_level_positions(text, separator)]
    for word in _OR_WORDS:
        for i in top_level_positions(text, word):
            before = text[i - 1] if i > 0 else " "
            after = text[i + len(word)] if i + len(word) < len(text) else " "
            if before.isspace() and after.isspace():
                cuts.append((i, i + len(word)))
    if not cuts:
        return [text]
    cuts.sort()
    items, start = [], 0
    for begin, end in cuts:
        if begin < start:
            continue  # overlapping separators, e.g. ", or"
        items.append(text[start:begin])
        start = end
    items.append(text[start:])
    return [item.strip() for item in items]


def solution_values(text: str) -> list[str] | None:
    """The values of a solution list (`x=1 or x=2` -> ["1", "2"]), or None when text is not one."""
    items = [item for item in _split_items(text) if item]
    if len(items) < 2:
        return None
    values: list[str] = []
    variables: set[str] = set()
    for item in items:
        variable, value = split_assignment(item)
        if variable is not None:
            variables.add(variable)
        elif is_equation(item) or _RELATION.search(item):
            return None
        values.append(value)
    if len(variables) > 1:
        return None  # `x=1, y=2` is a system, not alternatives
    return values
