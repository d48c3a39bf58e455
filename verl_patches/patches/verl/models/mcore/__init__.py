"""Patches of verl.models.mcore.* owned by the weight sync (G10)."""
