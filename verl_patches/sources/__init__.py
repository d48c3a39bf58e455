"""Reproduce the six upstream package folders exactly from `sources.lock`.

Standard library only: this package runs before any project dependency is installed
(`setup_sources.sh` calls `python3 -m verl_patches.sources`).
"""
