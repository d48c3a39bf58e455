"""pytest plugin of the process that runs vllm-ascend's own tests (`-p upstream_plugin`, see upstream_runner.py).

It makes the process a process of the job before upstream's conftest imports vLLM (our prelude: the torch_npu
emulation, vllm/vllm-ascend's generated metadata, our declared patches), then applies `selection.toml`: a file
every test of which is excluded is never imported (its imports are often what cannot run here), the tests of the
batch named by VERL_PATCHES_UPSTREAM_BATCH run, every other collected test is deselected (with no batch named,
nothing is: a run that only collects). It writes one JSON report (VERL_PATCHES_UPSTREAM_REPORT): every collected
test with its decision, and each run test's outcome.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import verl_patches.prelude_patch  # noqa: F401  (first: what every process of the job runs)
from upstream_selection import EXCLUDED, RUN, decide, file_excluded, load_rules
from verl_patches.base.atomic_write import write_json_atomically

BATCH_ENV = "VERL_PATCHES_UPSTREAM_BATCH"
REPORT_ENV = "VERL_PATCHES_UPSTREAM_REPORT"
SELECTION_ENV = "VERL_PATCHES_UPSTREAM_SELECTION"


class _Recorder:
    def __init__(self, config: pytest.Config) -> None:
        self.rules = load_rules(Path(os.environ[SELECTION_ENV]))
        self.batch = os.environ.get(BATCH_ENV, "")
        self.report_path = Path(os.environ[REPORT_ENV])
        self.root = Path(str(config.rootpath))
        self.collected: dict[str, dict[str, str]] = {}
        self.ignored: dict[str, str] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}

    def _rel(self, path: Path) -> str:
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    @pytest.hookimpl(tryfirst=True)
    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
            return None
        rel = self._rel(collection_path)
        reason = file_excluded(self.rules, rel)
        if reason:
            self.ignored[rel] = reason
            return True
        return None

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep, drop = [], []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            d = decide(self.rules, item.nodeid, params)
            self.collected[item.nodeid] = {"kind": d.kind, "batch": d.batch, "reason": d.reason, "rule": d.rule}
            (keep if d.kind == RUN and d.batch == self.batch else drop).append(item)
        if drop and self.batch:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.outcomes.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0, "message": ""})
        entry["seconds"] += report.duration
        if report.failed or (report.skipped and entry["outcome"] == "passed"):
            entry["outcome"] = "failed" if report.failed else "skipped"
            text = report.longreprtext or ""
            entry["message"] = f"{report.when}: " + "\n".join(text.strip().splitlines()[-12:])

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        write_json_atomically(
            self.report_path,
            {
                "batch": self.batch,
                "exitstatus": int(exitstatus),
                "collected": self.collected,
                "ignored_files": self.ignored,
                "outcomes": self.outcomes,
                "excluded": {k: v["reason"] for k, v in self.collected.items() if v["kind"] == EXCLUDED},
            },
            indent=1,
        )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Recorder(config), "verl_patches_upstream_recorder")
