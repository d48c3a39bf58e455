"""megatron.core (core_r0.8.0): the CPU port and the train-engine patches D3, D4."""

from verl_patches.patching.declaration import Kind, Patch, lazy_call, lazy_object  # noqa: F401

PATCHES: list[Patch] = []
