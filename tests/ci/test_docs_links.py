"""README.md is the front door and docs/*.md the rooms behind it: every relative link of either resolves to a file
that exists and every `#anchor` to a heading of its page (as GitHub names headings), every page is linked from
README and links back to it, README fits a screen's worth of scrolling, and every file of the repository that the
documentation names by its path exists (a moved module shows here, not in a reader's shell)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

import docs_text

REPO = docs_text.REPO
README_MAX_LINES = 300
# the contributor's pages: checked for links and named files like the user's, linked from README
CONTRIBUTOR_PAGES = [REPO / "CONTRIBUTING.md", REPO / "tests" / "README.md"]
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:", re.I)
# a repository path written in backticks: a folder we own, then a file name with an extension, no placeholder
REPO_PATH = re.compile(r"`((?:verl_patches|tests|bench)/[\w./-]*\.\w+)`")


def slug(title: str) -> str:
    """GitHub's anchor of a heading: link text kept, lower case, punctuation other than - and _ dropped, spaces
    to hyphens."""
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    out = set()
    for _, _, title in docs_text.headings(markdown):
        base = slug(title)
        out.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return out


def prose(markdown: str) -> str:
    """`markdown` without its code: fenced blocks and inline code spans (which may hold brackets) become blanks,
    line breaks kept so that line numbers stay true."""
    markdown = re.sub(r"```.*?```", lambda m: re.sub(r"[^\n]", " ", m.group(0)), markdown, flags=re.S)
    for span in (r"``.+?``", r"`[^`]+`"):
        markdown = re.sub(span, lambda m: re.sub(r"[^\n]", " ", m.group(0)), markdown, flags=re.S)
    return markdown


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every inline link of `page` outside code."""
    body = prose(page.read_text(encoding="utf-8"))
    return [(body.count("\n", 0, m.start()) + 1, m.group(2)) for m in LINK.finditer(body)]


def broken(page: Path, repo: Path = REPO) -> list[str]:
    """One line per link of `page` that does not resolve inside `repo`."""
    problems = []
    for line, target in links(page):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(repo)}:{line}: ({target})"
        if not dest.exists():
            problems.append(f"{where}: no file {path}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{where}: no heading '#{anchor}' in {dest.relative_to(repo)}")
        elif not dest.is_relative_to(repo):
            problems.append(f"{where}: leaves the repository")
    return problems


def test_every_link_and_anchor_of_the_documentation_resolves() -> None:
    problems = [p for page in [*docs_text.pages(), *CONTRIBUTOR_PAGES] for p in broken(page)]
    assert not problems, "\n".join(problems)


def test_every_page_is_linked_from_readme_and_links_back() -> None:
    readme_targets = {t.partition("#")[0] for _, t in links(docs_text.README)}
    for page in docs_text.pages()[1:]:
        assert f"docs/{page.name}" in readme_targets, f"README.md does not link docs/{page.name}"
        back = {t.partition("#")[0] for _, t in links(page)}
        assert "../README.md" in back, f"docs/{page.name} does not link back to README.md"
    assert "CONTRIBUTING.md" in readme_targets, "README.md does not link CONTRIBUTING.md"


def test_readme_fits_a_screens_worth_of_scrolling() -> None:
    lines = docs_text.README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to a page under docs/"


def test_every_repository_file_the_documentation_names_exists() -> None:
    missing = sorted(
        {
            f"{page.relative_to(REPO)}: {path}"
            for page in [*docs_text.pages(), *CONTRIBUTOR_PAGES]
            for path in REPO_PATH.findall(page.read_text(encoding="utf-8"))
            if not (REPO / path).exists()
        }
    )
    assert not missing, "the documentation names files that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Quick start on a fresh CPU machine (no NPU needed)", "quick-start-on-a-fresh-cpu-machine-no-npu-needed"),
        ("5. Check, then launch", "5-check-then-launch"),
        ("Validation, and is my run healthy?", "validation-and-is-my-run-healthy"),
        ("The rollout engine's settings", "the-rollout-engines-settings"),
        ("Set-up caches (`setup_cpu_env.sh`: the wheel cache)", "set-up-caches-setup_cpu_envsh-the-wheel-cache"),
        ("Link [here](x.md) — and more", "link-here--and-more"),
    ],
)
def test_anchors_are_named_as_github_names_them(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_link_or_anchor_is_named_and_code_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Two words\n\n## Two words\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# R\n[ok](docs/a.md#two-words-1) [gone](docs/b.md) [no anchor](docs/a.md#three)\n"
        "[self](#r) [web](https://example.com/x#y) `[not](a link)`\n```\n[nor](this)\n```\n"
    )
    assert broken(page, tmp_path) == [
        "README.md:2: (docs/b.md): no file docs/b.md",
        "README.md:2: (docs/a.md#three): no heading '#three' in docs/a.md",
    ]
