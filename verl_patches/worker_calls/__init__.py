"""What the driver's step and its worker calls agree on, in one place below both of them.

  step_payloads     what each worker call of a step receives (with the D2D cache: only what the workers do
                    not already hold) and the ``meta_info`` keys every call carries (the step, the D2D flag)
  logprob_mismatch  the rollout/training log-prob mismatch metric: the driver computes it from its batch, the
                    actor worker from its micro-batches when the old-log-prob pass is skipped

The driver (`verl_patches.driver.fit_loop`), the worker-side patches (`verl_patches.patches.verl.workers`) and
the driver's bounded wait (`verl_patches.resilience.worker_deadline`) all read these names; none of them owns
them. Importing this package has no side effects.
"""
