"""Unicode mathematics to the LaTeX the rest of the reward understands.

Policies write `∞`, `π`, `√2`, `x²`, `½` or `−5` as often as LaTeX; the ground truths are LaTeX.
Each symbol maps to the LaTeX command with the same meaning, so the two sides compare equal after
canonicalisation. One left-to-right pass, linear in the length of the text.
"""

from __future__ import annotations

from fractions import Fraction

# A trailing space keeps the command separate from a following letter (`πr` -> `\pi r`, not `\pir`).
_SYMBOLS = {
    "\u2212": "-",  # minus sign
    "\ufe63": "-",  # small hyphen-minus
    "\uff0d": "-",  # full-width hyphen-minus
    "\u221e": "\\infty ",
    "\u03c0": "\\pi ",
    "\u03b8": "\\theta ",
    "\u03b1": "\\alpha ",
    "\u03b2": "\\beta ",
    "\u03b3": "\\gamma ",
    "\u03c6": "\\phi ",
    "\u00d7": "\\times ",
    "\u22c5": "\\cdot ",
    "\u00b7": "\\cdot ",
    "\u00f7": "\\div ",
    "\u00b1": "\\pm ",
    "\u2213": "\\mp ",
    "\u2264": "\\le ",
    "\u2a7d": "\\le ",
    "\u2265": "\\ge ",
    "\u2a7e": "\\ge ",
    "\u2260": "\\ne ",
    "\u2208": "\\in ",
    "\u222a": "\\cup ",
    "\u2229": "\\cap ",
    "\u2205": "\\emptyset ",
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
    "\u200b": "",
}
_ROOTS = {"\u221a": "\\sqrt", "\u221b": "\\sqrt[3]", "\u221c": "\\sqrt[4]"}
_SUPERSCRIPTS = dict(zip("\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207a\u207b", "0123456789+-"))
_SUBSCRIPTS = dict(zip("\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089", "0123456789"))
_VULGAR = {
    "\u00bd": Fraction(1, 2),
    "\u2153": Fraction(1, 3),
    "\u2154": Fraction(2, 3),
    "\u00bc": Fraction(1, 4),
    "\u00be": Fraction(3, 4),
    "\u2155": Fraction(1, 5),
    "\u2156": Fraction(2, 5),
    "\u2157": Fraction(3, 5),
    "\u2158": Fraction(4, 5),
    "\u2159": Fraction(1, 6),
    "\u215a": Fraction(5, 6),
    "\u2150": Fraction(1, 7),
    "\u215b": Fraction(1, 8),
    "\u215c": Fraction(3, 8),
    "\u215d": Fraction(5, 8),
    "\u215e": Fraction(7, 8),
    "\u2151": Fraction(1, 9),
    "\u2152": Fraction(1, 10),
}
_OPEN_CLOSE = {"(": ")", "{": "}"}


def _root_argument(text: str, start: int) -> tuple[str, int]:
    """The radicand after a root sign at `start` and the index after it: a group, digits, or one symbol."""
    n = len(text)
    i = start
    while i < n and text[i] == " ":
        i += 1
    if i < n and text[i] in _OPEN_CLOSE:
        opener, closer = text[i], _OPEN_CLOSE[text[i]]
        depth = 0
        for j in range(i, n):
            if text[j] == opener:
                depth += 1
            elif text[j] == closer:
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j], j + 1
        return "", start  # unbalanced: leave the rest alone
    j = i
    while j < n and (text[j].isdigit() or text[j] == "."):
        j += 1
    if j > i:
        return text[i:j], j
    if i < n and text[i].isalpha():
        return text[i], i + 1
    if i < n and text[i] == "\\":
        j = i + 1
        while j < n and text[j].isalpha():
            j += 1
        if j > i + 1:  # a command word such as \pi; `\{` or `\\` is no radicand
            return text[i:j], j
    return "", start


def _run(text: str, start: int, table: dict[str, str]) -> tuple[str, int]:
    j = start
    while j < len(text) and text[j] in table:
        j += 1
    return "".join(table[c] for c in text[start:j]), j


def unicode_to_latex(text: str) -> str:
    """`√2` -> `\\sqrt{2}`, `x²` -> `x^{2}`, `1½` -> `\\frac{3}{2}`, `∞` -> `\\infty`, ...; ASCII is unchanged."""
    if text.isascii():
        return text
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _ROOTS:
            radicand, end = _root_argument(text, i + 1)
            if radicand:
                out.append(f"{_ROOTS[ch]}{{{unicode_to_latex(radicand)}}}")
                i = end
            else:
                out.append(_ROOTS[ch] + " ")
                i += 1
        elif ch in _SUPERSCRIPTS:
            run, i = _run(text, i, _SUPERSCRIPTS)
            out.append(f"^{{{run}}}")
        elif ch in _SUBSCRIPTS:
            run, i = _run(text, i, _SUBSCRIPTS)
            out.append(f"_{{{run}}}")
        elif ch in _VULGAR:
            # A mixed number: `1½` is one and a half, not 1 times a half.
            k = len(out)
            while k > 0 and out[k - 1].isdigit() and len(out[k - 1]) == 1:
                k -= 1
            whole = int("".join(out[k:])) if k < len(out) else 0
            del out[k:]
            value = whole + _VULGAR[ch]
            out.append(f"\\frac{{{value.numerator}}}{{{value.denominator}}}")
            i += 1
        else:
            out.append(_SYMBOLS.get(ch, ch))
            i += 1
    return "".join(out)
