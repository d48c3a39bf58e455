"""Declared runtime patches: declaration, upstream fingerprints, registry, import hook, manifest.

Nothing here has import-time side effects; `verl_patches.prelude_patch` calls `activate()`.
"""
