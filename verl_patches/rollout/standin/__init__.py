"""CPU-only rollout stand-in: vLLM's surface (as verl v0.4.0 uses it) backed by transformers'
DeepseekV3ForCausalLM. Active only on a CPU host, through a declared patch (see
verl_patches/patches/verl/workers/rollout/declarations.py); listed by the audit.

  weights  vLLM's DeepSeek parameter layout at the pin (stacked gate/up, fused experts, EP-local experts),
           from vLLM's own mapping helpers and loader
  model    the model runner's `model`: vLLM-named parameters whose storage the HF model computes with
  cache    KV cache storage the HF attention writes into (allocated/freed by the lifecycle)
  sampler  SamplingParams semantics verl uses (temperature, top_k, top_p, n, max_tokens, logprobs)
  engine   `LLM`: generate, llm_engine...model_runner.model, engine core KV configs, sleep/wake_up
"""
