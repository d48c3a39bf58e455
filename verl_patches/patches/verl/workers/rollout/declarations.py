"""Patches of verl.workers.rollout.vllm_rollout (verl v0.4.0's SPMD vLLM rollout)."""

from verl_patches.patches.upstream_fingerprints import pinned
from verl_patches.patching.declaration import CPU_ONLY, Kind, Patch, lazy_object, replace, wrap

_SPMD = "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd"
_USES_LLM = (f"{_SPMD}:vLLMRollout.__init__", f"{_SPMD}:vLLMRollout.generate_sequences")

PATCHES = [
    replace(
        name="verl.vllm_rollout_spmd.LLM.lifecycle",
        target=f"{_SPMD}:LLM",
        fingerprint=pinned(*_USES_LLM),
        fingerprint_of=_USES_LLM,
        by="verl_patches.rollout.engine_factory:build_llm",
        vendor_item="E1,F1",
        reason="vLLM's LLM without sleep mode (camem) or prefix caching: sleep/wake_up become KV free/init and "
        "weight offload/onload; EP on with VLLM_DP_SIZE>1; TorchAir/scheduler additional_config; built "
        "under the real torch.compile",
        devices=("npu",),
        rebind=False,
    ),
    replace(
        name="cpu.verl.vllm_rollout_spmd.LLM.lifecycle",
        target=f"{_SPMD}:LLM",
        fingerprint=pinned(*_USES_LLM),
        fingerprint_of=_USES_LLM,
        by="verl_patches.patches.verl.workers.rollout.emulated_npu:build_llm",
        vendor_item="E1,F1",
        reason="the same engine as verl.vllm_rollout_spmd.LLM.lifecycle on a CPU host (vllm-ascend's NPUWorker, "
        "model runner, DeepSeek model, TorchAir compile), on the npu device emulation: its build, generate, sleep "
        "and wake-up run where npu means the emulated device, not the CPU that Megatron's remapping gives",
        devices=CPU_ONLY,
        rebind=False,
    ),
    Patch(
        name="cpu.verl.vllm_rollout_spmd.LLM.standin",
        target=f"{_SPMD}:LLM",
        kind=Kind.REPLACE,
        fingerprint=pinned(*_USES_LLM),
        fingerprint_of=_USES_LLM,
        replacement=lazy_object("verl_patches.rollout.engine_factory:build_standin_llm"),
        vendor_item="local",
        reason="test double, opt-in (VERL_PATCHES_ROLLOUT_STANDIN=1), never in the tiny run: vLLM's LLM surface "
        "verl uses backed by transformers' DeepseekV3ForCausalLM, for a test whose claim is verl's side of the "
        "seam, not the engine (tests/rollout/test_verl_rollout.py), and must stay fast on 2 cores; "
        "replaces the real engine binding above on a CPU host when the switch is on",
        devices=CPU_ONLY,
        env_flag="VERL_PATCHES_ROLLOUT_STANDIN",
        rebind=False,  # only verl's rollout module builds the stand-in
    ),
    wrap(
        name="verl.vllm_rollout_spmd.vLLMRollout.__init__.a3_checks",
        target=f"{_SPMD}:vLLMRollout.__init__",
        fingerprint=pinned(f"{_SPMD}:vLLMRollout.__init__"),
        by="verl_patches.patches.verl.workers.rollout.init_checks:without_checks",
        # recompiled from the source of what it wraps, which must be upstream's own __init__: declared before
        # dp_env_and_compile, so it is the innermost layer and that wrap runs around it
        calls_original=False,
        vendor_item="F1",
        reason="upstream's __init__ without its two checks the A3 rollout trips (enforce_eager=False with "
        "free_cache_engine=True; chunked prefill with max_num_batched_tokens < max_model_len), every other "
        "statement upstream's; what they protected is refused up front (driver.rollout_settings)",
        devices=("npu", "cpu"),
    ),
    wrap(
        name="verl.vllm_rollout_spmd.vLLMRollout.__init__.dp_env_and_compile",
        target=f"{_SPMD}:vLLMRollout.__init__",
        fingerprint=pinned(f"{_SPMD}:vLLMRollout.__init__"),
        by="verl_patches.rollout.verl_hooks:wrap_rollout_init",
        vendor_item="F1,F2",
        reason="export VLLM_DP_* per rank before vLLM's parallel state is built (expert parallelism in the "
        "rollout) and build the engine under the real torch.compile, not MindSpeed's jit.script",
        devices=("npu", "cpu"),
    ),
    wrap(
        name="verl.vllm_rollout_spmd.vLLMRollout.generate_sequences.real_compile",
        target=f"{_SPMD}:vLLMRollout.generate_sequences",
        fingerprint="sha256:dee252dabf7e0d16",
        by="verl_patches.rollout.verl_hooks:wrap_generate_sequences",
        vendor_item="F1",
        reason="the rollout runs under the real torch.compile; MindSpeed's substitute applies only while training. "
        "Its output gets each response's count of tokens sampled in TorchAir graph decode steps "
        "(rollout_graph_decode_tokens, verl_patches.rollout.decode_share), which the driver turns into "
        "rollout/graph_decode_token_share and drops",
        devices=("npu", "cpu"),
    ),
]
