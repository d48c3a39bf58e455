#!/usr/bin/env bash
# One command from a fresh CPU machine to a working overlay: upstream sources exactly as sources.lock
# pins them, then a Python virtual environment (.venv) with A3's own package versions.
#   bash verl_patches/scripts/setup_cpu_env.sh
# Needs python3.11 (PYTHON=/path/to/python3.11 to choose one), git and network access to PyPI (or a
# PyPI mirror through PIP_INDEX_URL). Downloads are cached in ~/.cache (pip's cache), never in the repo.
#
# The versions are requirements.txt's (the A3 job's), minus only what cannot exist on a CPU host
# (verl_patches/sources/pins.py: NOT_ON_CPU, each with its reason), plus requirements-test.txt's test
# tools; constraints-cpu.txt (generated from such an environment) fixes the transitive versions.
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

echo "== Python environment (.venv) from requirements.txt"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
reqs="$(mktemp "${TMPDIR:-/tmp}/verl-cpu-requirements.XXXXXX")"
trap 'rm -f "$reqs"' EXIT
"$py" -m verl_patches.sources.pins cpu-requirements > "$reqs"
.venv/bin/python -m pip install --quiet -r "$reqs" -r requirements-test.txt -c constraints-cpu.txt
# Every pin must hold: a package left at another version is a failure here, not a surprise in a test.
.venv/bin/python -m verl_patches.sources.pins check
.venv/bin/python - <<'PY'
import torch, verl, vllm, megatron.core  # noqa: F401  (the vendored trees import from the repo root)
print(f"   torch {torch.__version__}; verl, vllm and megatron.core import from {verl.__path__[0].rsplit('/', 1)[0]}")
PY
echo "== done: .venv is ready"
