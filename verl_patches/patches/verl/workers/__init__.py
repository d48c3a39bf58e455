"""Patches for upstream `verl.workers`."""
