#!/usr/bin/env bash
# One command from a fresh CPU machine to a working overlay: upstream sources exactly as sources.lock
# pins them, then a Python virtual environment (.venv) with A3's own package versions.
#   bash verl_patches/scripts/setup_cpu_env.sh
# Needs python3.11 (PYTHON=/path/to/python3.11 to choose one), git and network access to PyPI (or a
# PyPI mirror through PIP_INDEX_URL). Downloads are cached in ~/.cache, never in the repo.
#
# The versions are requirements.txt's (the A3 job's), minus only what cannot exist on a CPU host
# (verl_patches/sources/pins.py: NOT_ON_CPU, each with its reason), plus requirements-test.txt's test
# tools; constraints-cpu.txt (generated from such an environment) fixes the transitive versions, and
# requirements-cpu.lock.json (generated from those three: python -m verl_patches.sources.wheel_lock generate)
# holds the sha256 of every file installed.
set -euo pipefail
if [ "$#" -gt 0 ]; then  # it takes no arguments: --help prints the lines above, anything else is refused
  case "$1" in
    -h|--help)
      echo "usage: bash verl_patches/scripts/setup_cpu_env.sh   (no options; PYTHON=/path/to/python3.11 chooses the Python)"
      sed -n '2,/^set -euo pipefail$/{/^#/{s/^# \{0,1\}/  /;p}}' "${BASH_SOURCE[0]}"
      exit 0 ;;
    *) printf 'setup_cpu_env: unknown argument %q (it takes none; see --help)\n' "$1" >&2; exit 2 ;;
  esac
fi
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

echo "== Python environment (.venv) from requirements-cpu.lock.json (requirements.txt's pins, each file's sha256)"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
# Wheels are kept in the user's cache, ~/.cache/verl_overlay/wheels ($VERL_OVERLAY_CACHE/wheels): PyPI's torch
# 2.5.1 brings ~3 GB of CUDA libraries on x86_64, which the index here does not let pip cache. A warm cache
# installs offline; otherwise the missing files are fetched first. The folder must be yours alone, and every
# file is checked against the lock's sha256 before the installers (pip for uv, then uv, both with
# --require-hashes) see it: verl_patches/sources/wheel_cache.py. uv unpacks in parallel (about 1 minute where
# pip takes 2.5 on 2 cores) and compiles bytecode, because a host with PYTHONDONTWRITEBYTECODE set (the hosts
# here do) would otherwise compile every import in every process, every time.
"$py" -m verl_patches.sources.wheel_cache install --python .venv/bin/python
# Every pin must hold: a package left at another version, or one the hash-checked install did not put there,
# is a failure here, not a surprise in a test.
.venv/bin/python -m verl_patches.sources.pins check
.venv/bin/python - <<'PY'
import torch, verl, vllm, megatron.core  # noqa: F401  (the vendored trees import from the repo root)
print(f"   torch {torch.__version__}; verl, vllm and megatron.core import from {verl.__path__[0].rsplit('/', 1)[0]}")
PY
# the pinned torch_npu wheel whose op schemas, Meta functions and limits the emulation keeps: fetched, hash-checked
.venv/bin/python -m verl_patches.npu_emulation.wheel_contract.fetch
# torch_npu's CPU stand-in loads a C++ extension for the npu device; build it here, once, so that tests and CI
# ranks only ever load it (a C++17 compiler is needed; ninja comes with requirements.txt).
echo "== npu device emulation (C++ extension, built into the user's cache)"
.venv/bin/python -m verl_patches.npu_emulation.device.build
echo "== done: .venv is ready"
