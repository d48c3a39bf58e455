""".pre-commit-config.yaml names only what exists: local hooks (nothing fetched at commit time) whose entries
run a module .venv's Python has, over test files and folders of this repo; and it keeps the hooks the
contributor's path relies on (ruff's lint and format check, the layering and one-home tests, the type check)."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / ".pre-commit-config.yaml"
VENV_PYTHON = ".venv/bin/python"
# hook id -> what its entry must run (the module after `-m`, then arguments it must carry)
REQUIRED: dict[str, tuple[str, ...]] = {
    "ruff-check": ("ruff", "check"),
    "ruff-format": ("ruff", "format", "--check"),
    "layers-and-one-home": (
        "pytest",
        "tests/ci/test_layers.py",
        "tests/ci/test_one_home.py",
        "tests/ci/test_one_layout.py",
    ),
    "type-check": ("pytest", "tests/ci/test_type_check.py"),
}
_HOOK_KEYS = {"id", "name", "entry", "language", "types_or", "types", "files", "pass_filenames"}


def hooks() -> list[dict[str, Any]]:
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    repos = data.get("repos") if isinstance(data, dict) else None
    assert isinstance(repos, list) and repos, f"{CONFIG.name}: no repos"
    found = []
    for i, repo in enumerate(repos):
        assert repo.get("repo") == "local", (
            f"{CONFIG.name}: repos[{i}] is {repo.get('repo')!r}; only `repo: local` hooks (no fetch at commit time)"
        )
        found += repo.get("hooks", [])
    return found


def entry_words(hook: dict[str, Any]) -> list[str]:
    return shlex.split(hook["entry"])


def test_hooks_run_venv_modules_that_exist() -> None:
    for hook in hooks():
        where = f"{CONFIG.name}: hook {hook.get('id')!r}"
        assert set(hook) <= _HOOK_KEYS, f"{where}: unexpected keys {sorted(set(hook) - _HOOK_KEYS)}"
        assert hook.get("language") == "system", f"{where}: language must be 'system' (the venv's own tools)"
        words = entry_words(hook)
        assert words[:2] == [VENV_PYTHON, "-m"] and len(words) > 2, (
            f"{where}: entry {hook['entry']!r} must be `{VENV_PYTHON} -m <module> ...` (the pinned tools)"
        )
        assert (ROOT / VENV_PYTHON).exists(), f"{where}: {VENV_PYTHON} is missing (setup_cpu_env.sh makes it)"
        module = words[2]
        assert importlib.util.find_spec(module) is not None, f"{where}: module {module!r} is not installed"
        for word in words[3:]:
            if word.startswith("tests/") or word.endswith(".py"):
                assert (ROOT / word).is_file(), f"{where}: {word} does not exist"


def test_required_hooks_are_there() -> None:
    by_id = {hook.get("id"): hook for hook in hooks()}
    for hook_id, needed in REQUIRED.items():
        assert hook_id in by_id, f"{CONFIG.name}: hook {hook_id!r} is missing"
        words = entry_words(by_id[hook_id])
        module, rest = words[2], words[3:]
        assert module == needed[0] and all(w in rest for w in needed[1:]), (
            f"{CONFIG.name}: hook {hook_id!r} runs {' '.join(words[2:])!r}, expected {' '.join(needed)!r}"
        )


def test_whole_tree_hooks_take_no_file_names() -> None:
    """A hook that runs whole test files checks the tree, not the staged files: pre-commit must not append them."""
    for hook in hooks():
        if entry_words(hook)[2] == "pytest":
            assert hook.get("pass_filenames") is False, f"{CONFIG.name}: hook {hook['id']!r}: pass_filenames: false"
