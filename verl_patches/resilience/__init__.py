"""Keeping a long multi-node job honest about its failures: a stuck rank is named by rank, node, pid, phase,
step and micro-batch, without timing collectives (HCCL's return at enqueue).

progress (marks where the host waits) -> heartbeat (a side thread publishes them) -> call_watch and
hang_diagnosis (who holds a call up) -> worker_deadline (the driver's bounded wait, the report, the end of
the job). `watched()` lists what is watched and how, for the audit.
"""
