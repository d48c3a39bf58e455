"""Patches of verl.utils.checkpoint (and the trainer's save/load that drive it): atomic checkpoints and resume."""
