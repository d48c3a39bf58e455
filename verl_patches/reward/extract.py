"""Find the one answer a response commits to, under a format rule.

Only the text after the last `</think>` counts: reasoning may try many candidates, and grading any of
them would reward hedging. In that text the last `\\boxed{...}` / `\\boxed x` / `\\fbox{...}` wins.

Format rules (`FormatRule`):
- `strict` (default; DeepScaleR's own reward and the R1-Zero recipe): a response without `</think>`
  has no answer, and neither has one without a box after the last `</think>`.
- `relaxed` (other prompt templates, and the tiny local run whose model answers in one token): without
  think tags the whole response is the answer section, and without a box an explicitly marked final
  answer ("the answer is ...") is accepted.
A `<think>` left open after the last `</think>` is never graded under either rule.

Everything here is linear in the response length (no backtracking regexes), so 100 kB responses cost
milliseconds.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# Longest text accepted after an answer marker; a "final answer" is a short phrase, not a paragraph.
_MAX_MARKED_ANSWER_CHARS = 300
# Alternatives are tried left to right at each position, so "final answer is" beats "answer is".
_ANSWER_MARKER = re.compile(r"final answer is|final answer:|the answer is|answer is|answer:", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\n")


FORMAT_RULE_KEY = "custom_reward_function.reward_kwargs.format_rule"


class FormatRule(str, enum.Enum):
    STRICT = "strict"
    RELAXED = "relaxed"


def parse_format_rule(value: object) -> FormatRule:
    """A FormatRule from its config value; anything else is one clear error naming the key."""
    if isinstance(value, FormatRule):
        return value
    try:
        return FormatRule(value)
    except ValueError:
        allowed = ", ".join(rule.value for rule in FormatRule)
        raise ValueError(f"{FORMAT_RULE_KEY}={value!r}: must be one of {allowed}") from None


class AnswerSource(enum.Enum):
    BOXED = "boxed"
    MARKED = "marked"
    NONE = "none"  # no box (and, relaxed, no marked final answer)
    NO_THINK_CLOSE = "no_think_close"  # strict rule: the response never closed its reasoning
    UNCLOSED_THINK = "unclosed_think"  # reasoning never finished: nothing is graded
    MALFORMED_BOX = "malformed_box"  # the last box has no matching closing brace


@dataclass(frozen=True)
class ExtractedAnswer:
    text: str | None
    source: AnswerSource


def final_section(response: str) -> str | None:
    """The text after the last `</think>`; None when a `<think>` is left open."""
    close = response.rfind(THINK_CLOSE)
    if close >= 0:
        tail = response[close + len(THINK_CLOSE) :]
        return None if THINK_OPEN in tail else tail
    if THINK_OPEN in response:
        return None
    return response


def _matching_brace(text: str, open_index: int) -> int | None:
    """Index of the `}` closing the `{` at open_index; `\\{` and `\\}` are literal braces."""
    depth = 0
    i = open_index
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _last_box_command(text: str) -> tuple[int, str] | None:
    """Position and name of the last box command that is not a prefix of a longer command name."""
    end = len(text)
    while True:
        best: tuple[int, str] | None = None
        for command in _BOX_COMMANDS:
            pos = text.rfind(command, 0, end)
            if pos >= 0 and (best is None or pos > best[0]):
                best = (pos, command)
        if best is None:
            return None
        after = best[0] + len(best[1])
        # `\boxedsomething` or `\fboxsep` are other macros, not boxes.
        if after < len(text) and text[after].isalpha():
            end = best[0]
            continue
        return best


def last_boxed(text: str) -> ExtractedAnswer | None:
    """The content of the last box in text, or None if text has no box at all."""
    found = _last_box_command(text)
    if found is None:
        return None
    pos, command = found
    i = pos + len(command)
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] == "{":
        close = _matching_brace(text, i)
        if close is None:
            return ExtractedAnswer(None, AnswerSource.MALFORMED_BOX)
        return ExtractedAnswer(text[i + 1 : close].strip(), AnswerSource.BOXED)
    if i == pos + len(command) or i >= n:
        # `\boxed` glued to a non-space, non-brace character, or at the very end: not a box argument.
        return ExtractedAnswer(None, AnswerSource.MALFORMED_BOX)
    # `\boxed 5`: the argument is the next run of non-space characters.
    j = i
    while j < n and not text[j].isspace() and text[j] != "$":
        j += 1
    token = text[i:j].rstrip(".,;")
    if not token:
        return ExtractedAnswer(None, AnswerSource.MALFORMED_BOX)
    return ExtractedAnswer(token, AnswerSource.BOXED)


def _strip_math_delimiters(answer: str) -> str:
    answer = answer.strip().strip("*").strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if answer.startswith(left) and answer.endswith(right) and len(answer) >= len(left) + len(right):
            return answer[len(left) : len(answer) - len(right)].strip()
    return answer


def marked_answer(text: str) -> str | None:
    """The phrase after the last "the answer is" / "final answer:" marker, up to the sentence end."""
    last = None
    for marker in _ANSWER_MARKER.finditer(text):
        last = marker
    if last is None:
        return None
    rest = text[last.end() : last.end() + _MAX_MARKED_ANSWER_CHARS].lstrip(" :\t")
    end = _SENTENCE_END.search(rest)
    phrase = rest[: end.start()] if end else rest
    phrase = _strip_math_delimiters(phrase.strip().rstrip("."))
    return phrase or None


def extract_final_answer(response: str, rule: FormatRule = FormatRule.STRICT) -> ExtractedAnswer:
    """The graded answer of a response under `rule`, and where it came from."""
    if rule is FormatRule.STRICT and THINK_CLOSE not in response:
        source = AnswerSource.UNCLOSED_THINK if THINK_OPEN in response else AnswerSource.NO_THINK_CLOSE
        return ExtractedAnswer(None, source)
    section = final_section(response)
    if section is None:
        return ExtractedAnswer(None, AnswerSource.UNCLOSED_THINK)
    boxed = last_boxed(section)
    if boxed is not None:
        return boxed
    if rule is FormatRule.STRICT:
        return ExtractedAnswer(None, AnswerSource.NONE)
    marked = marked_answer(section)
    if marked is not None:
        return ExtractedAnswer(marked, AnswerSource.MARKED)
    return ExtractedAnswer(None, AnswerSource.NONE)
