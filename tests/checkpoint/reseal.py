"""Forgers of a committed step's manifest, for the tests that attack what lies behind it.

`reseal_signed` is the strongest forger: it can write the manifest and holds the run's secret (so it signs
through `commit.write_manifest`, as the save does); the tests that check what the archive reader and the digest
checks do with a file whose digest was resealed use it, so that the signature does not stop them first.
`reseal_unsigned` edits the JSON as any account that can write the file could: the signature stops it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_patches.checkpoint import commit
from verl_patches.checkpoint.manifest import SIGNATURE_KEY


def _edit(step: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    man = json.loads((step / "checkpoint.json").read_text())
    change(man)
    return man


def _record(step: Path, rel: str) -> Callable[[dict[str, Any]], None]:
    data = (step / rel).read_bytes()
    return lambda man: man["files"].__setitem__(rel, {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})


def reseal_signed(step: Path, rel: str | None = None, change: Callable[[dict[str, Any]], None] | None = None) -> None:
    """The manifest's record of ``rel`` made to match the file again (and ``change`` applied), re-signed with
    the run's secret."""
    man = _edit(step, lambda m: [f(m) for f in (_record(step, rel) if rel else None, change) if f])
    man.pop(SIGNATURE_KEY)
    commit.write_manifest(step, man)


def reseal_unsigned(step: Path, rel: str | None = None, change: Callable[[dict[str, Any]], None] | None = None) -> None:
    """The same edit by a forger without the secret: the old signature stays, and no longer matches."""
    man = _edit(step, lambda m: [f(m) for f in (_record(step, rel) if rel else None, change) if f])
    (step / "checkpoint.json").write_text(json.dumps(man))
