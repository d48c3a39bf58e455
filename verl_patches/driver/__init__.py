"""The driver's step: what runs in the process that drives the worker groups, one training step after another.

  fit_loop          ``RayPPOTrainer.fit`` for the overlay (A2): verl's loop with the step plan applied
  step_plan         what one step does (old-log-prob pass, D2D, fused role), decided once from config and env
  fused_role        the fused ActorRolloutRef role (A1): one worker group is actor, rollout and reference
  checkpoint_fence  background checkpoint writes waited for on every worker, then committed
  mismatch_gate     the warning and stop thresholds on the rollout/training log-prob mismatch
  rank_memory       each worker's peak memory after every step, and the run folder it is written to
  step_line         one compact line per step for a person watching the run
  run_metrics       a finished run's logged metrics read back (TensorBoard, else trainer.log; rank memory)
  plot              the run's curves as one PNG (``python -m verl_patches.driver.plot RUN_DIR``)
  config_checks     the rules of a composed config the step relies on, run by the entry and again by the loop
  rollout_settings  the rollout engine's settings that follow from others, and the rules that keep them whole
  logger_backends   ``trainer.logger``: each backend one verl knows and one this environment can import

Below `patches`, which installs it into verl (`patches.verl.trainer.ray_trainer`); above the engines, the weight
sync and the worker calls it drives. Importing this package has no side effects.
"""
