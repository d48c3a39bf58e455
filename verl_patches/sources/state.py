"""What setup installed into each package folder (route and provenance), kept at the repo root.

Used by the audit to find the pristine artifact for a diff. Written only when it changes, so a no-op
setup touches nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_patches.base.atomic_write import write_text_atomically
from verl_patches.sources.paths import STATE_FILE_NAME


def load_state(root: Path) -> dict[str, dict]:
    p = Path(root) / STATE_FILE_NAME
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return {}


def save_state(root: Path, state: dict[str, dict]) -> None:
    p = Path(root) / STATE_FILE_NAME
    text = json.dumps(state, indent=2, sort_keys=True) + "\n"
    if p.exists() and p.read_text(encoding="utf-8") == text:
        return
    write_text_atomically(p, text)
