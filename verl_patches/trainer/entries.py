"""The job's entry points, by module name: what the launcher starts (``python -m``) and what the entry names.

The CPU proof's entry is named, never imported: the trainer entry runs without the CPU proof, which wraps it
(`verl_patches.cpu_proof.main_tiny`: the trainer entry with the tiny profile's assets built first).
"""

TRAINER_ENTRY = "verl_patches.trainer.main_ppo_npu"
CPU_PROOF_ENTRY = "verl_patches.cpu_proof.main_tiny"
