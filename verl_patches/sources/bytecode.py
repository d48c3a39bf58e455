"""Byte-code in a package folder: every `.pyc` Python could import instead of its source is checked.

The tree hash leaves `__pycache__` out (importing writes it), so a planted `.pyc` whose header matches
its source's mtime and size would run instead of the source unseen. Here each byte-code file either is
proved equal to its source (the code object compiled from the source, at the file's optimisation
level, equals the one in the file) or is reported: byte-code of another interpreter, without a source,
outside `__pycache__`, unreadable, or different from its source. Proofs are cached by the content
hashes of the pair, so a warm check costs hashing only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import re
import sys
from pathlib import Path

from verl_patches.sources.paths import user_cache_dir

BYTECODE_SUFFIXES = (".pyc", ".pyo")
_PYC_NAME = re.compile(r"^(?P<stem>[^.]+)\.(?P<tag>[^.]+)(?:\.opt-(?P<opt>[12]))?\.pyc$")
_CACHE_FORMAT = "1"


def _proof_dir() -> Path:
    return user_cache_dir() / "bytecode-verified"


def _proof_key(pyc: bytes, source: bytes) -> str:
    tag = f"{_CACHE_FORMAT}|{sys.implementation.cache_tag}|".encode()
    return hashlib.sha256(tag + hashlib.sha256(pyc).digest() + hashlib.sha256(source).digest()).hexdigest()


def _remember(key: str) -> None:
    d = _proof_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / key).touch()
    except OSError:
        pass  # a read-only cache only costs the compile next time


def _code_in(pyc: bytes) -> object:
    """The code object of a .pyc of this interpreter (16-byte header, PEP 552)."""
    if len(pyc) < 16 or pyc[:4] != importlib.util.MAGIC_NUMBER:
        raise ValueError("not byte-code of this interpreter")
    return marshal.loads(pyc[16:])


def check_pyc(pyc_path: Path, source_path: Path, optimize: int) -> str | None:
    """None if `pyc_path` holds exactly the code of `source_path`, else why not."""
    try:
        pyc, source = pyc_path.read_bytes(), source_path.read_bytes()
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    key = _proof_key(pyc, source)
    if (_proof_dir() / key).exists():
        return None
    try:
        found = _code_in(pyc)
    except (ValueError, EOFError, TypeError) as e:
        return f"not loadable byte-code ({e})"
    try:
        expected = compile(source, str(source_path), "exec", dont_inherit=True, optimize=optimize)
    except (SyntaxError, ValueError) as e:
        return f"its source does not compile ({e})"
    if found != expected:
        return "its code differs from its source"
    _remember(key)
    return None


def bytecode_problems(folder: Path) -> list[str]:
    """Relative paths of byte-code files that are not proved equal to their sources, with the reason."""
    problems: list[str] = []
    tag = sys.implementation.cache_tag
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        here = Path(dirpath)
        in_cache = here.name == "__pycache__"
        for name in sorted(filenames):
            rel = (here / name).relative_to(folder).as_posix()
            if in_cache:
                m = _PYC_NAME.match(name)
                if not m:
                    problems.append(f"{rel}: unexpected file in __pycache__")
                    continue
                if m["tag"] != tag:
                    problems.append(
                        f"{rel}: byte-code of {m['tag']}, which this {tag} check cannot prove "
                        f"equal to its source (run the check with that Python, or delete it)"
                    )
                    continue
                source = here.parent / f"{m['stem']}.py"
                if not source.is_file():
                    problems.append(f"{rel}: byte-code without a source file")
                    continue
                why = check_pyc(here / name, source, int(m["opt"] or 0))
                if why:
                    problems.append(f"{rel}: {why}")
            elif name.endswith(BYTECODE_SUFFIXES):
                # Python imports a `.pyc` beside the package files even with no source at all
                problems.append(f"{rel}: byte-code outside __pycache__ (imported without any source)")
    return problems
