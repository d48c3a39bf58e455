"""Patches for upstream `verl.trainer`."""
