"""Patches of verl.workers.actor.megatron_actor and the tensor-parallel helpers it uses (vendor items C3, C6)."""
