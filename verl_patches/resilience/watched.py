"""What hang diagnosis watches, where, how often and how (for the audit; pure data, no import of what it
describes)."""

from __future__ import annotations

from collections.abc import Mapping

from verl_patches.resilience.timeout import TIMEOUT_ENV, configured_timeout, publish_interval

PROGRESS_POINTS = (
    # (point, where it is recorded, how often)
    (
        "worker call: generate_sequences, compute_ref_log_prob, compute_log_prob, update_actor, init_model, "
        "save_checkpoint, load_checkpoint (phase and trainer step)",
        "verl_patches.patches.verl.workers.progress_points.with_call_progress (declared WRAPs of verl's "
        "Megatron ActorRolloutRefWorker)",
        "per call",
    ),
    ("phases weight_sync, generate, rollout_offload", "verl_patches.sync.sharding_manager (enter/exit)", "per call"),
    ("phase d2d_reshard", "verl_patches.patches.verl.workers.d2d_cache (ref and update with D2D)", "per call"),
    (
        "micro-batch k/N of batch b (ref, old log-prob, update)",
        "verl_patches.patches.verl.workers.progress_points.with_micro_batch_progress (declared WRAP of verl's "
        "make_batch_generator)",
        "per micro-batch",
    ),
    ("weight-sync bucket k", "verl_patches.sync.generator.iter_rollout_weights", "per bucket"),
    (
        "rollout engine step k",
        "verl_patches.rollout.standin.engine (the test-only stand-in; never in a job)",
        "per decode step, tests only",
    ),
)

NOT_WATCHED = (
    (
        "torch.distributed collectives",
        "not wrapped: HCCL returns at enqueue, so a host-side time says nothing "
        "about a missing peer, and a wrapper would run per layer per decode step",
    ),
    (
        "vLLM's decode loop (vllm-ascend's engine, on NPU and in the CPU tiny run)",
        "no progress point of ours per decode step; while in the coarse phase "
        "'generate' the heartbeat counts changes of the main thread's stack as activity",
    ),
)


def watched(environ: Mapping[str, str] | None = None) -> dict:
    """The audit's section: the time-out in force here, the points, the heartbeat, the driver's waits."""
    try:
        timeout = configured_timeout(environ)
        timeout_text = f"{timeout:g} s" if timeout else "unset: diagnosis off"
    except ValueError as e:
        timeout, timeout_text = 0.0, str(e)
    return {
        "timeout": {
            "variable": TIMEOUT_ENV,
            "value": timeout_text,
            "set_by": "the A3 launcher: 90% of HCCL_EXEC_TIMEOUT (verl_patches.launch.job_env)",
        },
        "driver": "every wait on a worker group (verl's func_generator, declared REPLACE) is bounded: when no "
        "outstanding worker makes progress for the time-out, the driver names them (rank, node, pid, "
        "phase, step, micro-batch, log file), signals torch_npu's flight recorder dump when the workers "
        "have it on, kills the group and fails with that line (the launcher repeats it last); a dead "
        "worker is named at once",
        "heartbeat": "one side thread per verl worker process (started by the declared WRAP of verl's "
        "Worker.__init__) publishes its position to Ray's GCS key-value store every "
        + (f"{publish_interval(timeout):g} s" if timeout else "time-out/20 s (0.2 to 5 s)")
        + "; frozen or dead = no new beat, stuck = no new mark while alive, behind = at an earlier "
        "position than a peer",
        "progress_points": [{"point": p, "where": w, "frequency": f} for p, w, f in PROGRESS_POINTS],
        "not_watched": [{"what": w, "why": y} for w, y in NOT_WATCHED],
        "npu": "torch_npu 2.5.1 HCCL monitor and flight recorder set by the launcher: TORCH_HCCL_ENABLE_MONITORING=1, "
        "TORCH_HCCL_DUMP_ON_TIMEOUT=1, TORCH_HCCL_TRACE_BUFFER_SIZE=2000, TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC="
        "the time-out, TORCH_HCCL_DEBUG_INFO_TEMP_FILE=/tmp/hccl_trace_rank_ (dumps <prefix><rank> per node)",
        "fault_injection": "VERL_PATCHES_INJECT_STOP=<rank>:<phase>:<step> stops that rank (SIGSTOP) entering the "
        "phase, VERL_PATCHES_INJECT_KILL=<rank>:<phase>:<step> kills it (SIGKILL) there (tests); checked at phase "
        "boundaries only; each fires once per run folder (VERL_PATCHES_RUN_DIR), so a restarted trainer gets past it",
    }


def render(section: dict) -> list[str]:
    out = [
        f"time-out: {section['timeout']['variable']} = {section['timeout']['value']} "
        f"(set by {section['timeout']['set_by']})",
        f"driver: {section['driver']}",
        f"heartbeat: {section['heartbeat']}",
        "progress points:",
    ]
    out += [f"  - {p['point']} [{p['frequency']}] at {p['where']}" for p in section["progress_points"]]
    out.append("not watched:")
    out += [f"  - {n['what']}: {n['why']}" for n in section["not_watched"]]
    out += [f"NPU: {section['npu']}", f"fault injection: {section['fault_injection']}"]
    return out
