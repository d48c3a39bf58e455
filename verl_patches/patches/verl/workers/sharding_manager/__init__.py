"""Patches of verl.workers.sharding_manager.* (the weight sync's E1)."""
