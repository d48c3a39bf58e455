"""Patches for upstream `torch` (pinned by the requirements files, not by sources.lock)."""
