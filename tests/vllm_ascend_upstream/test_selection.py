"""The selection of vllm-ascend's tests (upstream_selection.py, pure): which rule decides a test, and the data file."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upstream_runner import SELECTION
from upstream_selection import (
    EXCLUDED,
    RUN,
    UNACCOUNTED,
    Rule,
    SelectionError,
    covers,
    decide,
    file_excluded,
    load_rules,
    parse_rules,
)

NAME = st.text("abc_", min_size=1, max_size=4)


@st.composite
def node_ids(draw):
    folders = draw(st.lists(NAME, min_size=1, max_size=3))
    test = draw(NAME)
    params = draw(st.one_of(st.just(""), st.lists(NAME, min_size=1, max_size=3).map(lambda p: "[" + "-".join(p) + "]")))
    return "/".join(folders) + f"/test_{draw(NAME)}.py::test_{test}{params}"


def _prefixes(node_id: str) -> list[str]:
    """Every prefix of a node id that ends at a node boundary (folders, the file, the test, the whole id)."""
    file, _, rest = node_id.partition("::")
    parts = file.split("/")
    out = ["/".join(parts[: i + 1]) + "/" for i in range(len(parts) - 1)] + [file]
    out += [f"{file}::{rest.split('[')[0]}", node_id] if rest else []
    return list(dict.fromkeys(out))


@given(node_ids(), st.data())
def test_the_longest_covering_rule_decides(node_id, data):
    prefixes = _prefixes(node_id)
    chosen = data.draw(st.lists(st.sampled_from(prefixes), unique=True, min_size=1))
    rules = [
        Rule(p, batch=f"b{len(p)}", a3_path="x") if i % 2 else Rule(p, reason=f"r{len(p)}")
        for i, p in enumerate(chosen)
    ]
    longest = max(chosen, key=len)
    decision = decide(rules, node_id)
    assert decision.rule == longest
    assert decision.kind == (RUN if any(r.batch and r.id == longest for r in rules) else EXCLUDED)


@given(node_ids(), NAME)
def test_a_rule_covers_only_at_a_node_boundary(node_id, extra):
    file = node_id.split("::")[0]
    assert covers(file, node_id) and covers(node_id, node_id)
    assert not covers(node_id.split("[")[0] + extra, node_id.split("[")[0])  # a longer name is another test
    assert not covers(file[:-3], node_id)  # "test_x" does not cover "test_x.py"
    assert decide([Rule(file + extra, reason="r")], node_id).kind == UNACCOUNTED


def test_params_keep_some_parametrizations_and_name_the_reason_for_the_rest():
    rules = [
        Rule("t.py::test_a", batch="unit", params={"m": ("1", "64"), "flag": ("False",)}, others="why", a3_path="x")
    ]
    assert decide(rules, "t.py::test_a[1]", {"m": 1, "flag": False}).kind == RUN
    assert decide(rules, "t.py::test_a[33]", {"m": 33, "flag": False}).reason == "why"
    assert decide(rules, "t.py::test_a[1]", {"m": 1, "flag": True}).kind == EXCLUDED
    assert decide(rules, "t.py::test_a", {}).kind == EXCLUDED  # a test without the parameter is not kept


def test_a_file_is_left_unimported_only_when_none_of_its_tests_can_run():
    rules = [Rule("d/", reason="folder"), Rule("d/t.py::test_a", batch="unit", a3_path="x"), Rule("e/t.py", reason="f")]
    rules.append(Rule("p/t.py", batch="unit", params={"m": ("1",)}, others="o", a3_path="x"))
    assert file_excluded(rules, "d/t.py") == ""  # test_a runs: the file is imported
    assert file_excluded(rules, "d/u.py") == "folder"
    assert file_excluded(rules, "e/t.py") == "f"
    assert file_excluded(rules, "p/t.py") == ""  # some parametrizations run
    assert file_excluded(rules, "q/t.py") == ""  # undecided files are collected, to be reported unaccounted


@pytest.mark.parametrize(
    "rule, message",
    [
        ({"id": "a.py"}, "either `batch`"),
        ({"id": "a.py", "batch": "u", "reason": "r"}, "either `batch`"),
        ({"id": "a.py", "batch": "u"}, "a3_path: expected a non-empty string"),
        ({"id": "a.py", "reason": "r", "params": {"m": [1]}}, "belong to a rule that runs tests"),
        ({"id": "a.py", "batch": "u", "a3_path": "x", "params": {"m": [1]}}, "`others` says why"),
        ({"id": "a.py", "batch": "u", "a3_path": "x", "params": {"m": []}, "others": "o"}, "non-empty list"),
        ({"id": "a.py", "reason": "r", "typo": 1}, "unknown key 'typo'"),
        ({"id": "", "reason": "r"}, "rule 1.id: expected a non-empty string"),
    ],
)
def test_a_malformed_rule_is_refused_naming_the_file_rule_and_key(rule, message):
    with pytest.raises(SelectionError, match=message) as err:
        parse_rules({"rule": [rule]}, "sel.toml")
    assert str(err.value).startswith("sel.toml: rule")


def test_a_rule_declared_twice_is_refused():
    with pytest.raises(SelectionError, match="declared twice"):
        parse_rules({"rule": [{"id": "a.py", "reason": "r"}, {"id": "a.py", "reason": "s"}]}, "sel.toml")


def test_the_selection_file_parses_and_has_the_two_batches_the_suite_runs():
    rules = load_rules(SELECTION)
    assert {r.batch for r in rules if r.batch} == {"unit", "engine"}
    assert all(r.reason or r.a3_path for r in rules)
