"""Cheap checks that keep intractable answers away from sympy.

The symbolic path runs under a hard per-item deadline anyway; these checks make the common
adversarial shapes (power towers, huge exponents or factorials, deep nesting, long expressions)
cost microseconds instead of a killed worker. An answer refused here scores 0 unless it already
matched the ground truth on the fast path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SymbolicLimits:
    max_chars: int = 400
    max_nesting: int = 12
    max_exponent: int = 10_000
    max_factorial: int = 1_000


_FACTORIAL_OF_LITERAL = re.compile(r"(\d+)\s*!")
_FACTORIAL_OF_GROUP = re.compile(r"[)}\]]\s*!")


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


def _exponents(text: str) -> list[str]:
    """The argument of every `^` / `**`: a braced group, a digit run, or one character."""
    found = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == "^" or text.startswith("**", i):
            j = i + (1 if text[i] == "^" else 2)
            while j < n and text[j] == " ":
                j += 1
            if j < n and text[j] in "{(":
                opener, closer = text[j], "}" if text[j] == "{" else ")"
                depth, k = 0, j
                while k < n:
                    if text[k] == opener:
                        depth += 1
                    elif text[k] == closer:
                        depth -= 1
                        if depth == 0:
                            break
                    k += 1
                found.append(text[j + 1 : k])
            else:
                k = j
                while k < n and (text[k].isdigit() or (k == j and text[k] in "+-")):
                    k += 1
                found.append(text[j : max(k, j + 1)])
            i = j
            continue
        i += 1
    return found


def _huge_literal(text: str, bound: int) -> bool:
    digits = re.sub(r"[\s{}()+\-]", "", text)
    return digits.isdigit() and (len(digits) > len(str(bound)) or int(digits) > bound)


def symbolic_refusal(text: str, limits: SymbolicLimits = SymbolicLimits()) -> str | None:
    """Why text must not reach sympy, or None if it may."""
    if len(text) > limits.max_chars:
        return f"longer than {limits.max_chars} characters"
    if _nesting_depth(text) > limits.max_nesting:
        return f"nested deeper than {limits.max_nesting}"
    for exponent in _exponents(text):
        if "^" in exponent or "**" in exponent or "!" in exponent:
            return "power tower or factorial in an exponent"
        if _huge_literal(exponent, limits.max_exponent):
            return f"exponent above {limits.max_exponent}"
    for match in _FACTORIAL_OF_LITERAL.finditer(text):
        if _huge_literal(match.group(1), limits.max_factorial):
            return f"factorial above {limits.max_factorial}"
    if _FACTORIAL_OF_GROUP.search(text):
        return "factorial of an expression"
    return None
