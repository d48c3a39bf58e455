"""Patches for upstream `transformers`."""
