"""Prompt templates. The default asks for reasoning inside `<think> </think>` and the final answer in
`\\boxed{}` after it, which is exactly what the deepscaler reward grades."""

from __future__ import annotations

PROBLEM_FIELD = "{problem}"

TEMPLATES: dict[str, str] = {
    "r1_zero": (
        "Solve the following problem. First reason step by step inside <think> </think> tags, "
        "then, after </think>, give only the final answer in the form \\boxed{answer}.\n\n" + PROBLEM_FIELD
    ),
    "none": PROBLEM_FIELD,
}
DEFAULT_TEMPLATE = "r1_zero"


class TemplateError(ValueError):
    """Neither a known template name nor a template text containing {problem}."""


def resolve_template(name_or_text: str) -> str:
    """A template by name, or a custom template text that contains the {problem} field.

    A text that is not valid Unicode (bytes that were not UTF-8 on the command line arrive as lone
    surrogates) is refused here: it could not be written to the parquet file."""
    bad = next((i for i, ch in enumerate(name_or_text) if 0xD800 <= ord(ch) <= 0xDFFF), None)
    if bad is not None:
        ch = ord(name_or_text[bad])
        what = f"byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"lone surrogate U+{ch:04X}"
        raise TemplateError(f"--template: not UTF-8 text ({what} at character {bad + 1})")
    if name_or_text in TEMPLATES:
        return TEMPLATES[name_or_text]
    if PROBLEM_FIELD in name_or_text:
        return name_or_text
    shown = repr(name_or_text[:60]) + ("..." if len(name_or_text) > 60 else "")
    raise TemplateError(
        f"unknown template {shown}: use one of {sorted(TEMPLATES)} or a text containing {PROBLEM_FIELD}"
    )


def render_prompt(template: str, problem: str) -> str:
    # str.replace, not str.format: problems are LaTeX and full of braces.
    return template.replace(PROBLEM_FIELD, problem)
