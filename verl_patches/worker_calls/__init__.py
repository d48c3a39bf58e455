"""What the driver's step and its worker calls agree on, in one place below both of them.

  step_payloads     what each worker call of a step receives (with the D2D cache: only what the workers do
                    not already hold); `stamp` writes the step and the D2D flag every call carries
  meta_keys         the ``meta_info`` keys the driver, verl's dispatch and the workers read: the step, the D2D
                    flag, the Megatron DP rank map, the workers' phase timings
  env_names         the environment variables the launch and the trainer entry set for every worker: the KV-NZ
                    switch, the dies per card, the base of the vLLM DP master ports
  logprob_mismatch  the rollout/training log-prob mismatch metric: the driver computes it from its batch, the
                    actor worker from its micro-batches when the old-log-prob pass is skipped
  rollout_correction  TIS: the cap's config key and rule, and the batch key of the rollout's log-probs

The driver (`verl_patches.driver.fit_loop`), the launch, the engines, the worker-side patches
(`verl_patches.patches.verl.workers`) and the driver's bounded wait (`verl_patches.resilience.worker_deadline`)
all read these names; none of them owns them. Importing this package has no side effects.
"""
