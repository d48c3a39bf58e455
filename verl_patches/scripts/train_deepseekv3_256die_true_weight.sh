#!/usr/bin/env bash
# DeepSeek-V3 671B GRPO on 128 Atlas A3 cards (256 dies), true-weight profile.
# Run the SAME command on every node (head = the node that owns MASTER_ADDR):
#   bash verl_patches/scripts/train_deepseekv3_256die_true_weight.sh --env-file cluster.env
# Check everything first (no NPU needed):   ... --dry-run
# The whole pipeline on this machine:       ... --tiny
# --help lists every setting. Nothing here kills processes it did not start.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"
elif [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"
else py=python3; fi
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
VERL_LAUNCH_PROG="$(basename "${BASH_SOURCE[0]}")" exec "$py" -m verl_patches.launch.job --profile a3_256die_true_weight "$@"
