"""NPU overlay for verl v0.4.0: runtime patches, planners and tools for DeepSeek-V3 GRPO on Atlas A3.

Importing this package has no side effects; `verl_patches.prelude_patch` is the one module that
activates patches.
"""
