"""``python -m verl_patches.launch.preflight``: the preflight report (`report.main`)."""

import sys

from verl_patches.launch.preflight.report import main

if __name__ == "__main__":
    sys.exit(main())
