"""The ``meta_info`` keys of a DataProto that the driver, verl's dispatch and the workers all read.

  STEP_META_KEY       every worker call of a step: the trainer step (the collective watchdog's hang report,
                      the workers' progress marks); written by `step_payloads.stamp`
  D2D_META_KEY        every worker call of a step: whether it takes part in the D2D flow
  DP_RANKS_META_KEY   every MEGATRON_COMPUTE_PROTO call: global rank -> Megatron DP rank (vendor item B1),
                      written by the dispatch patch, read by the workers' D2D cache to split as the driver did
  TIMING_META_KEY     a worker call's output: seconds a worker spent in a phase the driver's timing cannot
                      see (the weight switch inside generate), read by the trainer's step metrics

Names only, no logic: whoever writes a key and whoever reads it import it from here.
"""

from __future__ import annotations

STEP_META_KEY = "global_steps"
D2D_META_KEY = "verl_patches_d2d"
DP_RANKS_META_KEY = "global_megatron_dp_ranks"
TIMING_META_KEY = "verl_patches_timing_s"
