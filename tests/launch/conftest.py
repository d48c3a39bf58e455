"""The launch tests' shared helper (`no_process_starts`), importable from the wings' folders too
(tests/launch/preflight/, tests/launch/cluster/), as pytest's rootdir import finds it beside the tests here."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
