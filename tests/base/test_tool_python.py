"""The documentation's tool commands (README.md, docs/*.md) run by a Python without requirements.txt's packages
(a bare `python`): one line naming the interpreter, the missing module and the Python to use, exit 2, never a
traceback; a missing module of our own package stays a traceback (a defect, not a wrong interpreter)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import docs_text
from verl_patches.base.tool_python import EXIT_WRONG_PYTHON, third_party_imports, wrong_python_line

REPO = Path(__file__).resolve().parents[2]


def test_a_missing_third_party_module_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e, third_party_imports("tool.py"):
        import verl_patches_absent_third_party.sub  # noqa: F401
    assert e.value.code == EXIT_WRONG_PYTHON == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == wrong_python_line("tool.py", "verl_patches_absent_third_party")
    assert sys.executable in line and ".venv/bin/python" in line and "requirements.txt" in line


def test_a_missing_module_of_our_own_is_not_hidden() -> None:
    with pytest.raises(ModuleNotFoundError), third_party_imports("tool.py"):
        import verl_patches.no_such_module  # noqa: F401


def fake_site(tmp_path: Path, module: str) -> dict[str, str]:
    """An environment whose `module` fails to import exactly as an absent one does."""
    site = tmp_path / "site" / module
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n")
    return {**os.environ, "PYTHONPATH": str(site.parent)}


@pytest.mark.parametrize(
    "script, args",
    [
        # the A3 guide's section 3, step 6 and section 6: the export back to Hugging Face format
        ("convert_ckpt_deepseek3.py", ["--reverse", "--load-dir", "/nonexistent", "--save-dir", "/nonexistent/hf"]),
        ("fp8_cast_bf16.py", ["--help"]),
        ("check_logprobs.py", ["--help"]),
    ],
)
def test_the_weight_tools_name_the_wrong_python(tmp_path: Path, script: str, args: list[str]) -> None:
    p = subprocess.run(
        [sys.executable, f"verl_patches/scripts/{script}", *args],
        cwd=REPO,
        env=fake_site(tmp_path, "torch"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    (line,) = p.stderr.strip().splitlines()
    assert p.returncode == 2 and line == wrong_python_line(script, "torch"), p.stderr


def test_the_docs_run_the_tool_scripts_with_a_python_that_has_the_packages() -> None:
    """The documentation's commands name `.venv/bin/python` (the CPU host) or `python3` (the image), as the A3
    guide's "Which Python" paragraph says; a bare `python` is whatever the shell finds first."""
    runs = []
    for page in docs_text.pages():
        body = page.read_text(encoding="utf-8")
        runs += [
            (f"{page.relative_to(REPO)}:{body.count(chr(10), 0, m.start()) + 1}", m.group(1))
            for m in re.finditer(r"(\S*python\S*)\s+verl_patches/scripts/\w+\.py", body)
        ]
    assert len(runs) >= 8, runs  # the data, weight, export and check commands
    bare = [(where, py) for where, py in runs if py.strip("`") not in (".venv/bin/python", "python3")]
    assert not bare, f"documentation lines run a tool script with another Python: {bare}"
