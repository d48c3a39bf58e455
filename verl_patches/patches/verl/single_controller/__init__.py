"""Patches for upstream `verl.single_controller`."""
