#!/usr/bin/env bash
# Shared body of the train_*.sh entry points: `launch_job.sh PROFILE "$@"`. Picks the Python (PYTHON,
# else the repo's .venv, else python3), makes the repo root importable and runs the launcher there.
set -euo pipefail
profile="$1"; shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"
elif [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"
else py=python3; fi
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m verl_patches.launch.job --profile "$profile" "$@"
