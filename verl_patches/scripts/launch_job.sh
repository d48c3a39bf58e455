#!/usr/bin/env bash
# Shared body of the train_*.sh entry points, and the way to run any profile (the smoke run's):
#   bash verl_patches/scripts/launch_job.sh PROFILE [options] [-- hydra overrides]
# Picks the Python (PYTHON, else the repo's .venv, else python3), makes the repo root importable and runs the
# launcher there with PROFILE as the script's own (VERL_LAUNCH_PROFILE: a different --profile is refused).
set -euo pipefail
usage() {
  echo "usage: bash verl_patches/scripts/launch_job.sh PROFILE [options] [-- hydra overrides]"
  echo "  PROFILE: a3_256die_true_weight, a3_256die_random_init or a3_16die_smoke"
  echo "  options: bash verl_patches/scripts/launch_job.sh PROFILE --help (the same as train_*.sh --help)"
}
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  ''|-*) usage >&2; exit 2 ;;
esac
profile="$1"; shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"
elif [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"
else py=python3; fi
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
VERL_LAUNCH_PROG="${VERL_LAUNCH_PROG:-launch_job.sh $profile}" VERL_LAUNCH_PROFILE="$profile" \
  exec "$py" -m verl_patches.launch.job "$@"
