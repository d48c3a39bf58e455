#!/usr/bin/env bash
# One command from a fresh CPU machine to a working overlay: upstream sources exactly as sources.lock
# pins them, then a Python virtual environment (.venv) with the CPU test stack.
#   bash verl_patches/scripts/setup_cpu_env.sh
# Needs python3.11 (PYTHON=/path/to/python3.11 to choose one), git and network access to PyPI (or a
# PyPI mirror through PIP_INDEX_URL). Downloads are cached in ~/.cache, never in the repo.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"

echo "== upstream sources (setup_sources.sh)"
rc=0; PYTHON="$py" bash setup_sources.sh || rc=$?
case "$rc" in
  0) ;;
  3) echo "   (components only the NPU job needs are missing here; the CPU environment does not need them)" ;;
  *) echo "setup_cpu_env: setup_sources.sh failed (exit $rc)" >&2; exit "$rc" ;;
esac

echo "== Python environment (.venv)"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install --quiet -r requirements-cpu.txt -c constraints-cpu.txt
.venv/bin/python - <<'PY'
import torch, verl, vllm, megatron.core  # noqa: F401  (the vendored trees import from the repo root)
print(f"   torch {torch.__version__}; verl, vllm and megatron.core import from {verl.__path__[0].rsplit('/', 1)[0]}")
PY
echo "== done: .venv is ready"
