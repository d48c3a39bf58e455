#!/usr/bin/env bash
# Populate the upstream package folders exactly as sources.lock pins them. `--help` lists the options.
# Needs only python3 (standard library), git and pip: run it before installing anything else.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "setup_sources.sh: $py not found (set PYTHON=/path/to/python3)" >&2; exit 2; }

# The lock is TOML: Python 3.11 reads it with the standard library; 3.10 needs tomli, which is fetched
# once into the user cache (never installed into the environment).
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  tools="${VERL_OVERLAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/verl_overlay}/tools"
  if ! PYTHONPATH="$tools" "$py" -c 'import tomli' 2>/dev/null; then
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$tools/wheels" 'tomli==2.2.1'
    "$py" -m zipfile -e "$tools"/wheels/tomli-*.whl "$tools"
  fi
  export PYTHONPATH="$tools${PYTHONPATH:+:$PYTHONPATH}"
fi
cd "$here"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
# --audit is the audit's report (verl_patches.audit reads the sources and the patches: it sits above the
# sources package in the layer order, so the sources command never imports it); the rest is the sources command.
for arg in "$@"; do
  if [ "$arg" = "--audit" ]; then
    exec "$py" -c 'import sys; from verl_patches.audit import setup_sources_main; sys.exit(setup_sources_main(sys.argv[1:]))' "$@"
  fi
done
exec "$py" -m verl_patches.sources "$@"
