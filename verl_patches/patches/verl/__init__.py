"""Patches for upstream `verl`."""
