"""The vendor item ids in the declarations are explained in this repository (VENDOR_ITEMS.md), and only those."""

from __future__ import annotations

import re

from tests.patching.patching_testlib import REPO
from verl_patches.patches.catalog import all_patches

GLOSSARY = REPO / "verl_patches" / "patches" / "VENDOR_ITEMS.md"
ROW = re.compile(r"^\| (local|[A-K]\d{0,2}) \| (.+?) \| (.+?) \|$")
NOT_APPLICABLE = "not applicable"


def glossary_rows(text: str) -> dict[str, tuple[str, str]]:
    """id -> (what it is, where it lives here); a repeated id is an error."""
    rows: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{GLOSSARY.name}: {m.group(1)} has two lines"
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def used_ids() -> dict[str, list[str]]:
    """vendor item id -> the patches that name it ("E2,E3,C4" names three)."""
    used: dict[str, list[str]] = {}
    for p in all_patches():
        for item in p.vendor_item.split(","):
            used.setdefault(item.strip(), []).append(p.name)
    return used


def test_every_id_a_declaration_uses_has_a_line():
    rows = glossary_rows(GLOSSARY.read_text())
    missing = {i: names for i, names in used_ids().items() if i not in rows}
    assert missing == {}, f"add these ids to {GLOSSARY.relative_to(REPO)}: {missing}"


def test_every_line_is_used_or_says_not_applicable():
    used = used_ids()
    rows = glossary_rows(GLOSSARY.read_text())
    assert {"local", "A1", "C1", "G10", "K3"} <= set(rows)  # the table parses
    unused = {i for i, (_, where) in rows.items() if i not in used and not where.startswith(NOT_APPLICABLE)}
    assert unused == set(), f"ids no declaration uses, not marked '{NOT_APPLICABLE}': {sorted(unused)}"
    stale = {i for i, (_, where) in rows.items() if i in used and where.startswith(NOT_APPLICABLE)}
    assert stale == set(), f"ids a declaration uses, marked '{NOT_APPLICABLE}': {sorted(stale)}"


def test_every_place_named_exists():
    for item, (_, where) in glossary_rows(GLOSSARY.read_text()).items():
        paths = re.findall(r"`([^`]+)`", where)
        assert paths or item == "local", f"{item}: name where it lives here"
        for path in paths:
            assert (REPO / path.rstrip("/")).exists(), f"{GLOSSARY.name}, {item}: {path} does not exist"


def test_the_auditing_page_links_the_glossary():
    assert "(../verl_patches/patches/VENDOR_ITEMS.md)" in (REPO / "docs" / "audit.md").read_text()
