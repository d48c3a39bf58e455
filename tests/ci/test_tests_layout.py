"""Every folder of tests/ says what it tests: the package of verl_patches at the same path (tests/driver tests
verl_patches/driver/, tests/launch/preflight verl_patches/launch/preflight/; a top-level module counts too:
tests/multirank tests verl_patches/multirank.py), or it is a special folder, listed in `SPECIAL` with its reason.
tests/README.md names every folder, every conftest and every helper module, so a newcomer finds where a test
belongs and what the shared helpers are before writing a second one."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "verl_patches"

# Folders that test no one package, each with its reason
SPECIAL: dict[str, str] = {
    "ci": "checks of the whole repository: layering, one home per mechanism, ruff, typing, the environment registry, "
    "the documentation's links, the test tiers, this layout",
    "e2e": "README command 1 end to end (the tiny run through the launcher, its golden check, faults and resume); "
    "run on its own, one test at a time",
    "megatron_engine": "verl's Megatron actor and reference as the job runs them: `train_engine` under the worker "
    "patches, against transformers' DeepseekV3",
    "vllm_ascend_upstream": "vllm-ascend's own tests, run on our torch_npu emulation",
}


def folders_of(tests: Path) -> list[Path]:
    """Every folder under `tests` that holds a Python file, but caches."""
    return sorted(
        {p.parent for p in tests.rglob("*.py") if "__pycache__" not in p.parts and p.parent != tests},
    )


def names(folder: Path, tests: Path, repo: Path, package: str = PACKAGE) -> str | None:
    """What `folder` names: 'package', 'module', 'special', or None."""
    rel = folder.relative_to(tests).parts
    if rel[0] in SPECIAL:
        return "special"
    if (repo / package / Path(*rel) / "__init__.py").is_file():
        return "package"
    if len(rel) == 1 and (repo / package / f"{rel[0]}.py").is_file():
        return "module"
    return None


def layout_problems(repo: Path, package: str = PACKAGE) -> list[str]:
    tests = repo / "tests"
    return [
        f"{f.relative_to(repo)}/: names no package or module of {package} (the folder of what it tests, "
        f"{package}/{f.relative_to(tests)}/) and is not in SPECIAL (tests/ci/test_tests_layout.py)"
        for f in folders_of(tests)
        if names(f, tests, repo, package) is None
    ]


def readme_problems(repo: Path) -> list[str]:
    """The folders, conftests and helper modules of tests/ that tests/README.md does not name."""
    tests = repo / "tests"
    readme = (tests / "README.md").read_text(encoding="utf-8")
    wanted = [f"`tests/{f.relative_to(tests)}/`" for f in folders_of(tests)]
    wanted += [
        f"`{p.relative_to(tests)}`"
        for p in sorted(tests.rglob("*.py"))
        if "__pycache__" not in p.parts and not p.name.startswith("test_") and p.name != "__init__.py"
    ]
    return [w for w in wanted if w not in readme]


# ------------------------------------------------------------------------------------------ the real tree


def test_every_tests_folder_names_a_package_or_is_special() -> None:
    problems = layout_problems(REPO)
    assert not problems, "\n".join(problems)


def test_the_special_folders_exist_and_name_no_package() -> None:
    for name in SPECIAL:
        assert (REPO / "tests" / name).is_dir(), f"SPECIAL names tests/{name}/, which does not exist"
        assert not (REPO / PACKAGE / name).exists(), f"tests/{name}/ names {PACKAGE}/{name}: it is not special"


def test_the_readme_names_every_folder_conftest_and_helper() -> None:
    missing = readme_problems(REPO)
    assert not missing, f"tests/README.md does not name: {missing}"


# ------------------------------------------------------------------------------- the checks themselves


def _write(root: Path, files: list[str]) -> None:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")


def test_a_folder_of_no_package_is_named_and_a_package_module_or_special_folder_is_not(tmp_path: Path) -> None:
    _write(
        tmp_path,
        [
            "pkg/__init__.py",
            "pkg/engine/__init__.py",
            "pkg/engine/wing/__init__.py",
            "pkg/harness.py",
            "tests/conftest.py",
            "tests/engine/test_a.py",
            "tests/engine/wing/test_b.py",
            "tests/harness/test_c.py",
            "tests/ci/test_d.py",
            "tests/misc/test_e.py",
            "tests/engine/other/test_f.py",
            "tests/harness/__pycache__/x.py",
        ],
    )
    assert [p.split(":")[0] for p in layout_problems(tmp_path, "pkg")] == ["tests/engine/other/", "tests/misc/"]
    (tmp_path / "tests" / "README.md").write_text("`tests/engine/` `tests/ci/` `conftest.py`")
    assert readme_problems(tmp_path) == [
        "`tests/engine/other/`",
        "`tests/engine/wing/`",
        "`tests/harness/`",
        "`tests/misc/`",
    ]
