"""How a worker process of ours (a multi-rank harness rank: check_logprobs', a test's or a benchmark's) ends
once its result is written.

Not through ``destroy_process_group``: on torch 2.5.1, ProcessGroupGloo's destructor waits for the group's
lock while its thread holds the GIL, and a gloo worker thread that is releasing a finished collective's tensor
holds that lock and waits for the GIL. Seen in the full suite, in a test's rank and in
``bench/bench_weight_sync.py``: one rank stuck for good, main thread in ``~ProcessGroupGloo``, a gloo thread in
``THPVariable_clear`` waiting for the GIL (gdb). The process's exit releases the group's sockets; its peers
have already synchronised with it through the collectives that produced the result.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_rank(status: int) -> NoReturn:
    """Flush this process's output and end it with `status`, skipping interpreter teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
