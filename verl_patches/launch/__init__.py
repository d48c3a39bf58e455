"""Bringing up the job: the launcher, the job's environment and settings, and its two wings.

  job                ``python -m verl_patches.launch.job``: the one launcher behind train_deepseekv3_256die_*.sh
  settings           cluster settings of a launch: flags, an env file, the environment, documented defaults
  job_env            the environment every process of an A3 job gets (vendor reference §3)
  run_dir            the launch's run folder: created new, private, written relative to its descriptor
  pid_record         ``pids.json``: the processes a launch started, each by identity
  session_leftovers  what is left of a child's own session once it exited, and ending it
  restarts           the restart loop: run the trainer, diagnose a failure, decide, wait, run it again
  restart_policy     whether, and after how long, the launcher restarts the trainer (pure)
  failure_diagnosis  what ended a run of the trainer, in one phrase naming cause, node and step (pure)
  preflight/         everything that can be known before a job starts (``python -m verl_patches.launch.preflight``)
  cluster/           Ray on the nodes, calls on every node, the collective check, logs, stop

Importing this package has no side effects.
"""
