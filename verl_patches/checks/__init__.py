"""check_logprobs: do the training engine and the rollout compute what Hugging Face computes, for a given
checkpoint and layout?

- `truncate`: streamed first-K-layers / first-M-experts copies of an HF or Megatron checkpoint.
- `sequences`: the token sequences every engine scores (seeded) and their data-parallel shares.
- `reference`: HF transformers' per-token log-probs (the reference).
- `compare`: max/mean absolute difference per engine, the worst token, the verdict and report lines.
- `launch`: the ranks (gloo on a CPU host, HCCL on A3), bounded in time.
- `engine_ranks`: what each rank runs: verl's Megatron worker (the A3 loading code) and the rollout after
  the weight sync.
- `memory`: the memory estimate per phase and process (pure), printed first and used to refuse up front.
- `rss`: summed RSS / RssAnon of the check's process tree (the bench and the test holding it to the estimate).
- `run`: the whole check, called by `verl_patches/scripts/check_logprobs.py`.
"""
