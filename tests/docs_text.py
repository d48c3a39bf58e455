"""The user documentation as tests read it: README.md (the front door) and the pages under docs/.

Every test that checks what the documentation says (a documented command runs, a code block parses, a table is
generated, an example line is the code's) reads it through here, so a text moved between README and a page, or
between two pages, is still found; a marker that names two different code blocks is an error either way."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
FENCE = re.compile(r"```(?:bash)?\n(.*?)```", re.S)
HEADING = re.compile(r"(#{1,6}) +(.*?) *#*$")


def pages() -> list[Path]:
    """README.md, then every page of docs/ by name."""
    return [README, *sorted(DOCS.glob("*.md"))]


def text() -> str:
    """All of the documentation, README first, pages separated by a blank line."""
    return "\n\n".join(p.read_text(encoding="utf-8") for p in pages())


def code_blocks() -> list[str]:
    """Every fenced code block, a numbered list item's 3-space indent removed."""
    return [re.sub(r"^ {3}", "", b, flags=re.M) for b in FENCE.findall(text())]


def code_block(marker: str) -> str:
    """The one code block that contains `marker` (the same block may appear more than once)."""
    hits = {b for b in code_blocks() if marker in b}
    assert len(hits) == 1, f"{len(hits)} different code blocks of README.md and docs/*.md contain {marker!r}"
    return hits.pop()


def headings(markdown: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of each heading outside code fences."""
    out, fenced = [], False
    for i, line in enumerate(markdown.split("\n")):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.fullmatch(line)
        if m:
            out.append((i, len(m.group(1)), m.group(2)))
    return out


def section(title: str) -> str:
    """The text under the one heading titled `title` (any level, any page), up to the next heading of the same
    or a higher level."""
    found = []
    for page in pages():
        lines = page.read_text(encoding="utf-8").split("\n")
        marks = headings("\n".join(lines))
        for n, (i, level, name) in enumerate(marks):
            if name == title:
                end = next((j for j, lv, _ in marks[n + 1 :] if lv <= level), len(lines))
                found.append("\n".join(lines[i + 1 : end]))
    assert len(found) == 1, f"{len(found)} headings of README.md and docs/*.md are titled {title!r}"
    return found[0]
