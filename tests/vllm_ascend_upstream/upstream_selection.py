"""Which of vllm-ascend's own tests the suite runs, and why each other one does not run here (pure).

The data is `selection.toml`: a list of rules, each naming a node id or a prefix of node ids of upstream's tests
(`tests/singlecard/ops/test_multi_step.py`, `...::test_name`, `tests/ut/`) and either the batch (one pytest
process) that runs them, or the reason they cannot run on a CPU host. The rule with the longest id that is a
prefix of a test's node id at a node boundary decides for that test; two rules with the same id are an error. A
rule that runs tests may keep only some parametrizations (`params`: name -> allowed values, compared as text)
and then names the reason for the others (`others`). A test no rule covers is `UNACCOUNTED`: the suite fails on it,
so a new upstream test cannot go unnoticed after a re-pin.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN, EXCLUDED, UNACCOUNTED = "run", "excluded", "unaccounted"
_BOUNDARIES = ("", "/", ":", "[")


class SelectionError(ValueError):
    """The selection file is malformed; the message names the file, the rule and the key."""


@dataclass(frozen=True)
class Rule:
    id: str
    batch: str = ""  # the batch that runs the tests it selects ("" for an excluding rule)
    reason: str = ""  # why the tests it excludes cannot run here (excluding rules)
    params: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # kept parametrizations (running rules)
    others: str = ""  # why the parametrizations `params` leaves out do not run
    a3_path: str = ""  # running rules: whether A3's job runs the code under test, and where


@dataclass(frozen=True)
class Decision:
    kind: str  # RUN, EXCLUDED or UNACCOUNTED
    batch: str = ""
    reason: str = ""
    rule: str = ""  # the id of the deciding rule


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SelectionError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def parse_rules(data: Mapping[str, Any], where: str) -> tuple[Rule, ...]:
    """Rules of a loaded selection file; `where` names the file in errors."""
    raw = data.get("rule")
    if not isinstance(raw, list) or not raw:
        raise SelectionError(f"{where}: expected a list of [[rule]] tables")
    rules, seen = [], {}
    for i, table in enumerate(raw):
        at = f"{where}: rule {i + 1}"
        if not isinstance(table, dict):
            raise SelectionError(f"{at}: expected a table")
        unknown = sorted(set(table) - {"id", "batch", "reason", "params", "others", "a3_path"})
        if unknown:
            raise SelectionError(f"{at}: unknown key {unknown[0]!r}")
        rule_id = _text(table.get("id"), f"{at}.id")
        at = f"{where}: rule {rule_id!r}"
        if rule_id in seen:
            raise SelectionError(f"{at}: declared twice (rules {seen[rule_id]} and {i + 1})")
        seen[rule_id] = i + 1
        if ("batch" in table) == ("reason" in table):
            raise SelectionError(f"{at}: give either `batch` (the tests run) or `reason` (they do not), not both")
        if "reason" in table:
            if "params" in table or "others" in table or "a3_path" in table:
                raise SelectionError(f"{at}: `params`, `others` and `a3_path` belong to a rule that runs tests")
            rules.append(Rule(rule_id, reason=_text(table["reason"], f"{at}.reason")))
            continue
        params_raw = table.get("params", {})
        if not isinstance(params_raw, dict):
            raise SelectionError(f"{at}.params: expected a table of name = [values]")
        params = {}
        for name, values in params_raw.items():
            if not isinstance(values, list) or not values:
                raise SelectionError(f"{at}.params.{name}: expected a non-empty list of values")
            params[name] = tuple(str(v) for v in values)
        if bool(params) != ("others" in table):
            raise SelectionError(f"{at}: `params` keeps some parametrizations; `others` says why the rest do not run")
        rules.append(
            Rule(
                rule_id,
                batch=_text(table["batch"], f"{at}.batch"),
                params=params,
                others=_text(table["others"], f"{at}.others") if params else "",
                a3_path=_text(table.get("a3_path"), f"{at}.a3_path"),
            )
        )
    return tuple(rules)


def load_rules(path: Path) -> tuple[Rule, ...]:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SelectionError(f"{path}: not valid TOML: {e}") from None
    return parse_rules(data, str(path))


def covers(rule_id: str, node_id: str) -> bool:
    """`rule_id` is `node_id` or a prefix of it that ends at a node boundary (a folder, a '::' or a '[')."""
    if not node_id.startswith(rule_id):
        return False
    rest = node_id[len(rule_id) :]
    return rule_id.endswith("/") or any(rest.startswith(b) for b in _BOUNDARIES if b) or rest == ""


def decide(rules: Sequence[Rule], node_id: str, params: Mapping[str, Any] | None = None) -> Decision:
    """What happens to the test `node_id` (with these parametrization values): the longest covering rule decides."""
    matching = [r for r in rules if covers(r.id, node_id)]
    if not matching:
        return Decision(UNACCOUNTED)
    rule = max(matching, key=lambda r: len(r.id))
    if rule.reason:
        return Decision(EXCLUDED, reason=rule.reason, rule=rule.id)
    given = params or {}
    kept = all(name in given and str(given[name]) in allowed for name, allowed in rule.params.items())
    if not kept:
        return Decision(EXCLUDED, reason=rule.others, rule=rule.id)
    return Decision(RUN, batch=rule.batch, rule=rule.id)


def file_excluded(rules: Sequence[Rule], path: str) -> str:
    """The reason a whole test file is excluded ("" when some test of it may run): such files are not even
    imported, since their imports are often what cannot run here. A file is excluded when the rule deciding it
    excludes (a running rule that keeps some parametrizations does not) and no rule deeper in it runs tests."""
    matching = [r for r in rules if covers(r.id, path)]
    if not matching:
        return ""
    rule = max(matching, key=lambda r: len(r.id))
    deeper = [r for r in rules if r.id != path and covers(path, r.id)]
    return "" if rule.batch or any(r.batch for r in deeper) else rule.reason
