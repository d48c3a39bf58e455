"""A command-line tool started by a Python without requirements.txt's packages says so in one line, not a traceback.

README's commands name `.venv/bin/python` (the CPU host) or the image's `python3`; a bare `python` is often
another interpreter, whose first `import torch` would otherwise end the tool with a ModuleNotFoundError traceback.
Only a missing third-party module is turned into that line: a missing module of our own package is a defect and
keeps its traceback. Standard library only.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

EXIT_WRONG_PYTHON = 2  # bad usage, as the tools' other usage errors


def wrong_python_line(tool: str, module: str, executable: str | None = None) -> str:
    """The one line naming the tool, the interpreter and the module it lacks, and which Python to use instead."""
    return (
        f"{tool}: this Python ({executable or sys.executable}) has no module '{module}' (requirements.txt): run it "
        f"with .venv/bin/python (made by verl_patches/scripts/setup_cpu_env.sh) or the Python that "
        f"`pip install -r requirements.txt` went into"
    )


@contextlib.contextmanager
def third_party_imports(tool: str) -> Iterator[None]:
    """Around a tool's imports: a third-party module that is not installed exits with `EXIT_WRONG_PYTHON` and
    `wrong_python_line` on stderr."""
    try:
        yield
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if not top or top == "verl_patches":
            raise
        print(wrong_python_line(tool, top), file=sys.stderr)
        raise SystemExit(EXIT_WRONG_PYTHON) from None
