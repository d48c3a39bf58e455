"""The one home of each upstream fingerprint that more than one declaration pins.

A fingerprint (`verl_patches.patching.fingerprint`) says which upstream source a patch was written
against. Where several declarations rely on the same upstream object (the Megatron worker's methods
carry two or three wraps each; the fit loop calls helpers other patches replace), they read its value
here, so moving to a new upstream pin changes one line per object. A fingerprint that only one
declaration uses stays beside that declaration. `tests/patching/test_fingerprint_homes.py` refuses a
fingerprint literal written twice in the catalog and two values for one upstream object.

Keys are the fingerprinted sources: one "module:qualname", or a tuple of them for a fingerprint taken
over several sources together (`Patch.fingerprint_of`).
"""

from __future__ import annotations

_WORKER = "verl.workers.megatron_workers:ActorRolloutRefWorker"
_SPMD = "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd:vLLMRollout"
_TRAINER = "verl.trainer.ppo.ray_trainer:RayPPOTrainer"

UPSTREAM_FINGERPRINTS: dict[str | tuple[str, ...], str] = {
    # verl's Megatron worker: D2D cache, progress points, temperature, checkpoint (megatron_declarations,
    # workers.declarations, utils.checkpoint.declarations)
    f"{_WORKER}.generate_sequences": "sha256:5d343eed8e9b5efc",
    f"{_WORKER}.compute_ref_log_prob": "sha256:78cd82e383702008",
    f"{_WORKER}.compute_log_prob": "sha256:f01abc1745a4c4e1",
    f"{_WORKER}.update_actor": "sha256:2d577a0fd0a2b110",
    f"{_WORKER}.init_model": "sha256:5ff5e4bac0b5e9a0",
    f"{_WORKER}.save_checkpoint": "sha256:d2161384f9bd2067",
    f"{_WORKER}.load_checkpoint": "sha256:9c3ec75b93b07c65",
    # verl's SPMD vLLM rollout: the A3 checks, the DP environment, and the engine its __init__ builds
    f"{_SPMD}.__init__": "sha256:7d4430ccf148ca6c",
    (f"{_SPMD}.__init__", f"{_SPMD}.generate_sequences"): "sha256:3c1c605129261085",
    # vllm-ascend's per-step DP metadata all-reduce (the method and the module name `dist` it calls)
    "vllm_ascend.worker.model_runner_v1:NPUModelRunner._get_forward_metadata_across_dp": "sha256:0a368e62fb52f5f9",
    # the driver: patched by the step metrics, the fused role and checkpointing, and called by our fit loop
    "verl.trainer.ppo.metric_utils:compute_throughout_metrics": "sha256:60a463364a4e1d69",
    f"{_TRAINER}.init_workers": "sha256:75e2048defa69674",
    f"{_TRAINER}._save_checkpoint": "sha256:cb278748657f4828",
    f"{_TRAINER}._load_checkpoint": "sha256:c4f100f1f314ffc6",
}


def pinned(*sources: str) -> str:
    """The pinned fingerprint of one upstream source, or of several fingerprinted together."""
    key: str | tuple[str, ...] = sources[0] if len(sources) == 1 else tuple(sources)
    try:
        return UPSTREAM_FINGERPRINTS[key]
    except KeyError:
        raise KeyError(
            f"no fingerprint for {key!r} in {__name__}.UPSTREAM_FINGERPRINTS: add it there "
            f"(python -m verl_patches.patching.fingerprint {' '.join(sources)})"
        ) from None
