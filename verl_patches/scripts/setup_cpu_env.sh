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

echo "== Python environment (.venv) from requirements.txt"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
reqs="$(mktemp "${TMPDIR:-/tmp}/verl-cpu-requirements.XXXXXX")"
trap 'rm -f "$reqs"' EXIT
"$py" -m verl_patches.sources.pins cpu-requirements > "$reqs"
# Wheels are kept in the user's cache: PyPI's torch 2.5.1 brings ~3 GB of CUDA libraries on x86_64, which
# the index here does not let pip cache. A warm cache installs offline; otherwise fill it, then install.
wheels="${VERL_OVERLAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/verl_overlay}/wheels"
mkdir -p "$wheels"
set -- -r "$reqs" -r requirements-test.txt -c constraints-cpu.txt
# uv (pinned in requirements-test.txt) installs the same pinned set from the same cache, unpacking in parallel:
# about 1 minute where pip takes 2.5 on 2 cores. Bytecode is compiled at install because a host with
# PYTHONDONTWRITEBYTECODE set (the hosts here do) would otherwise compile every import in every process, every time.
install_from_cache() {
  .venv/bin/python -m pip install --quiet --no-index --find-links "$wheels" -c constraints-cpu.txt uv &&
    .venv/bin/uv pip install --quiet --python .venv/bin/python --no-cache --link-mode copy --compile-bytecode \
      --no-index --find-links "$wheels" "$@"
}
if ! install_from_cache "$@" 2>/dev/null; then
  echo "   filling the wheel cache $wheels (first time: about 3.5 GB on x86_64)"
  .venv/bin/python -m pip wheel --quiet --progress-bar off -w "$wheels" --find-links "$wheels" "$@"
  install_from_cache "$@"
fi
# Every pin must hold: a package left at another version is a failure here, not a surprise in a test.
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
