"""The preflight: everything that can be known before a job starts, each finding naming what to change.

``python -m verl_patches.launch.preflight`` runs it (`report`); each other module is one group of checks, or a
model they share:

  report            every check run, rendered as text or JSON; the command line
  findings          the unit of a report: one check's outcome and the key or setting that changes it
  layout            parallel-layout and batch arithmetic of a composed config
  rank_table        the per-rank layout a job will use (``--dry-run``)
  files             the files a job reads: data, model config and tokenizer, Megatron checkpoint
  checkpoint        the checkpoint folder, what checkpointing costs, the step a resume would take
  checkpoint_nodes  the checkpoint folder checked on every node, once all nodes joined
  host              what only the cluster node can answer (NIC, CANN, NPUs, torch_npu, ports)
  env               every registered variable the job would see, parsed as the job parses it
  vendor_env        the vendor recipe's variables that work differently here
  memory            the per-die memory estimate as findings
  memory_estimate   the per-die memory model of the job: training and rollout
  mc2               HCCL_BUFFSIZE against what MC2 needs at the profile's sizes
  mc2_buffer        MC2's HCCL_BUFFSIZE rules
  run_costs         what checkpointing and validation cost on A3
  run_end           when the run will end, in steps and hours
  validation        how often the run validates, on how many prompts, at what cost

Importing this package has no side effects.
"""
