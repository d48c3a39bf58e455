"""Nothing of hang diagnosis sits on the hot path: no patch of a collective (no per-collective work),
none on vLLM or a model's forward (no per-decode-step or compiled-region work); its patches are the worker
calls, the micro-batch iterator, the driver's wait and the worker's constructor."""

from __future__ import annotations

from verl_patches.patches.catalog import all_patches

DIAGNOSIS_TARGETS = {
    "verl.trainer.ppo.ray_trainer:RayPPOTrainer.fit",  # the driver's step loop: the step it is in
    "verl.single_controller.ray.base:func_generator",
    "verl.single_controller.base.worker:Worker.__init__",
    "verl.utils.megatron.pipeline_parallel:make_batch_generator",
} | {
    f"verl.workers.megatron_workers:ActorRolloutRefWorker.{m}"
    for m in (
        "generate_sequences",
        "compute_ref_log_prob",
        "compute_log_prob",
        "update_actor",
        "init_model",
        "save_checkpoint",
        "load_checkpoint",
    )
}


def test_no_patch_wraps_a_collective() -> None:
    import torch.distributed as dist

    collectives = {n for n in dir(dist.distributed_c10d) if not n.startswith("_")}
    assert [
        p.name
        for p in all_patches()
        if p.target.startswith("torch.distributed.distributed_c10d")
        or (p.target.startswith("torch.distributed:") and p.qualname in collectives)
    ] == []


def test_diagnosis_patches_are_only_at_call_and_micro_batch_boundaries() -> None:
    ours = [
        p
        for p in all_patches()
        if "resilience" in p.name or p.name.endswith("_progress") or "hang diagnosis" in p.reason
    ]
    assert {p.target for p in ours} == DIAGNOSIS_TARGETS, sorted(p.target for p in ours)
