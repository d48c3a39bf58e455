"""Drift inside conditional code (issue 18): a definition chosen by an if/else, try/except, loop or match
must change its fingerprint whenever any code that may become the definition changes, including an
import that binds the name, a tuple assignment, and the condition that picks the branch."""

from __future__ import annotations

import textwrap

import pytest

from verl_patches.patching.fingerprint import fingerprint_target


@pytest.fixture(params=["off", "cache"])
def fp(tmp_path, monkeypatch, request):
    """fingerprint(source, qualname) of a module file rewritten in place (same path, as drift happens),
    with the on-disk cache off and on."""
    monkeypatch.setenv("VERL_PATCHES_FINGERPRINT_CACHE", "off" if request.param == "off" else str(tmp_path / "fpcache"))
    mod = tmp_path / "src" / "upstream_mod.py"
    mod.parent.mkdir()

    def fingerprint(source: str, qualname: str = "f") -> str:
        mod.write_text(textwrap.dedent(source))
        return fingerprint_target(f"upstream_mod:{qualname}", root=mod.parent)

    return fingerprint


IF_ELSE = """
    import sys
    if sys.version_info >= (3, 11):
        def f():
            return 1
    else:
        {else_branch}
"""


@pytest.mark.parametrize(
    "before,after",
    [
        ("def f():\n            return 2", "def f():\n            return 3"),
        ("from fast_impl import f", "from other_impl import f"),
        ("from fast_impl import g as f", "from fast_impl import h as f"),
        ("import f", "import f.sub as f"),
        ("f, g = (lambda: 2), None", "f, g = (lambda: 3), None"),
        ("[f, *rest] = impls", "[f, *rest] = other_impls"),
        ("f = staticmethod(impl)", "f = staticmethod(other)"),
    ],
    ids=["def", "from-import", "from-import-as", "import-as", "tuple-target", "starred-list-target", "assign"],
)
def test_a_change_in_the_else_branch_changes_the_fingerprint(fp, before, after):
    assert fp(IF_ELSE.format(else_branch=before)) != fp(IF_ELSE.format(else_branch=after))


def test_the_condition_that_picks_the_branch_is_part_of_the_fingerprint(fp):
    base = IF_ELSE.format(else_branch="def f():\n            return 2")
    assert fp(base) != fp(base.replace("(3, 11)", "(3, 99)"))
    assert fp(base) != fp(base.replace("if sys.version_info >= (3, 11):", "if False:"))


def test_try_except_fallbacks(fp):
    src = """
        try:
            from fast_impl import f
        except {exc}:
            def f():
                return {value}
    """
    base = fp(src.format(exc="ImportError", value=1))
    assert base != fp(src.format(exc="ImportError", value=2))  # the fallback
    assert base != fp(src.format(exc="ImportError", value=1).replace("fast_impl", "slow_impl"))  # the import
    assert base != fp(src.format(exc="Exception", value=1))  # which failures select the fallback


def test_methods_and_classes_defined_under_a_condition(fp):
    method = """
        class A:
            if FLAG:
                def f(self):
                    return 1
            else:
                def f(self):
                    return {value}
    """
    assert fp(method.format(value=2), "A.f") != fp(method.format(value=3), "A.f")
    assert fp(method.format(value=2), "A.f") != fp(method.format(value=2).replace("FLAG", "OTHER"), "A.f")
    klass = """
        if {cond}:
            class A:
                def f(self):
                    return 1
        else:
            class A:
                def f(self):
                    return 2
    """
    assert fp(klass.format(cond="HAS_NPU"), "A.f") != fp(klass.format(cond="HAS_GPU"), "A.f")


@pytest.mark.parametrize(
    "src,edit",
    [
        ("for f in impls:\n    pass", ("impls", "others")),
        ("while not done:\n    def f(): return 1\n    break", ("return 1", "return 2")),
        ("with lock:\n    def f(): return 1", ("lock", "other_lock")),
        (
            "match mode:\n    case 'a':\n        def f(): return 1\n    case _:\n        def f(): return 2",
            ("return 2", "return 3"),
        ),
        (
            "match mode:\n    case 'a':\n        def f(): return 1\n    case _:\n        def f(): return 2",
            ("'a'", "'b'"),
        ),
    ],
    ids=["for-target", "while", "with", "match-branch", "match-pattern"],
)
def test_other_compound_statements(fp, src, edit):
    assert fp(src) != fp(src.replace(*edit))


def test_formatting_comments_and_other_names_do_not_change_it(fp):
    base = textwrap.dedent(IF_ELSE.format(else_branch="def f():\n            return 2"))
    same = base.replace("return 2", "return 2  # a comment").replace("def f():", "def f( ):")
    assert fp(base) == fp(same)
    assert fp(base) == fp(base + "\ndef g():\n    return 99\n")
    assert fp(base) == fp(base.replace("else:\n", "else:\n    h = 5\n"))
