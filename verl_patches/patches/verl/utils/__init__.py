"""Patches for upstream `verl.utils`."""
