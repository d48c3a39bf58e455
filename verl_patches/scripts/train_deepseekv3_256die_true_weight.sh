#!/usr/bin/env bash
# DeepSeek-V3 671B GRPO on 128 Atlas A3 cards (256 dies), true-weight profile.
# Run the SAME command on every node (head = the node that owns MASTER_ADDR):
#   bash verl_patches/scripts/train_deepseekv3_256die_true_weight.sh --env-file cluster.env
# Check everything first (no NPU needed):   ... --dry-run
# The whole pipeline on this machine:       ... --tiny
# --help lists every setting. Nothing here kills processes it did not start.
set -euo pipefail
VERL_LAUNCH_PROG="$(basename "${BASH_SOURCE[0]}")" exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_job.sh" a3_256die_true_weight "$@"
