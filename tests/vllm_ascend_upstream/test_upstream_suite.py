"""vllm-ascend v0.9.1's own tests as a second judge of the torch_npu emulation.

The tests are the lock's pinned ones (sources.lock: components.vllm_ascend.upstream_tests), unpacked and hash-checked;
`selection.toml` decides, for every test upstream has under tests/ut, tests/singlecard and tests/ops, the batch that
runs it or the reason it cannot run on a CPU host. Each batch runs in a process of its own set up as the job's
processes are (upstream_runner.py, upstream_plugin.py); a selected test that does not pass fails its batch here, named
with its message. A test no rule decides, or a rule that decides nothing, fails the unit batch's test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from upstream_runner import SELECTION, BatchRun, run_batch
from upstream_selection import RUN, UNACCOUNTED, decide, load_rules

RULES = load_rules(SELECTION)
CONSIDERED = ["tests/ut", "tests/singlecard", "tests/ops"]
# seconds a batch's process may take on a loaded 2-core host
BATCH_TIMEOUT_S = 900

pytestmark = [pytest.mark.needs_components("vllm", "vllm_ascend"), pytest.mark.slow]


def batch_paths(batch: str) -> list[str]:
    """The test files (or folders) the rules of `batch` name, in the order of the rules."""
    paths: list[str] = []
    for rule in RULES:
        path = rule.id.split("::", 1)[0]
        if rule.batch == batch and path not in paths:
            paths.append(path)
    return paths


def _failure(run: BatchRun, lines: list[str]) -> str:
    return "\n".join(lines + [f"(process exit {run.returncode}; its last lines:)", run.output_tail])


def _check_batch(run: BatchRun, batch: str) -> None:
    """Every test the rules select for `batch` was collected, ran and passed."""
    assert run.report, _failure(run, [f"batch {batch}: the process wrote no report"])
    selected = sorted(n for n, d in run.report["collected"].items() if d["kind"] == RUN and d["batch"] == batch)
    assert selected, _failure(run, [f"batch {batch}: no test of the batch was collected"])
    outcomes = run.report["outcomes"]
    bad = {n: outcomes.get(n, {"outcome": "not run", "message": ""}) for n in selected}
    bad = {n: o for n, o in bad.items() if o["outcome"] != "passed"}
    lines = [f"{n}: {o['outcome']}\n    " + o["message"].replace("\n", "\n    ") for n, o in sorted(bad.items())]
    assert not bad, _failure(
        run, [f"batch {batch}: {len(bad)} of {len(selected)} selected tests did not pass:", *lines]
    )


def _check_accounting(run: BatchRun) -> None:
    """Every upstream test of CONSIDERED is decided by a rule; every running rule runs some test and every excluding
    rule excludes some test or file (a rule that does nothing at the pin is stale)."""
    collected, ignored = run.report["collected"], run.report["ignored_files"]
    unaccounted = sorted(n for n, d in collected.items() if d["kind"] == UNACCOUNTED)
    assert not unaccounted, "no rule of selection.toml decides these upstream tests:\n" + "\n".join(unaccounted)
    running = {d["rule"] for d in collected.values() if d["kind"] == RUN}
    excluding = {d["rule"] for d in collected.values() if d["kind"] != RUN} | {decide(RULES, p).rule for p in ignored}
    stale = sorted(r.id for r in RULES if r.id not in (running if r.batch else excluding))
    assert not stale, "these rules of selection.toml run or exclude nothing at the pin:\n" + "\n".join(stale)


def test_unit_tests_pass_and_every_upstream_test_is_decided(
    upstream_rootdir: Path, hub_cache: Path, tmp_path: Path
) -> None:
    """The "unit" batch (no model runs). Its process collects all of CONSIDERED (one vLLM import for both jobs): the
    accounting is checked on the same collection."""
    run = run_batch(upstream_rootdir, CONSIDERED, "unit", hub_cache, tmp_path / "report.json", BATCH_TIMEOUT_S)
    _check_batch(run, "unit")
    _check_accounting(run)


def test_engine_tests_pass_on_small_local_models(upstream_rootdir: Path, hub_cache: Path, tmp_path: Path) -> None:
    """The "engine" batch: vLLM's LLM started on vllm-ascend's engine over the emulation, one file after another."""
    run = run_batch(
        upstream_rootdir, batch_paths("engine"), "engine", hub_cache, tmp_path / "report.json", BATCH_TIMEOUT_S
    )
    _check_batch(run, "engine")
