"""Declared runtime patches: declaration, upstream fingerprints, registry, import hook, manifest, and the
Ray runtime environment that activates them in every worker process (`ray_runtime`).

Nothing here has import-time side effects; `verl_patches.prelude_patch` calls `activate()`.
"""
