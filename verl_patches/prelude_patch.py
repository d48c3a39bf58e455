"""Activation point of the overlay: importing this module applies our declared runtime patches.

Imported (a) by the one line setup_sources.sh inserts into verl/workers/megatron_workers.py, so every
process that loads verl's Megatron workers (driver and Ray workers) is patched before those modules
run; (b) by our trainer entry; (c) by the Ray worker process setup hook `activate` below, for worker
types that never load megatron_workers. Idempotent: a second import or call changes nothing.
"""

from pathlib import Path as _Path

from verl_patches.npu_emulation import install_on_cpu_host as _install_npu_emulation
from verl_patches.patches.catalog import all_patches as _all_patches
from verl_patches.patching.registry import activate as _activate_registry
from verl_patches.sources.dist_info import put_on_path as _put_dist_info_on_path

_REPO_ROOT = _Path(__file__).resolve().parents[1]

_install_npu_emulation()  # CPU host only: MindSpeed and vllm-ascend import our torch_npu stand-in
_put_dist_info_on_path(_REPO_ROOT)  # vLLM finds vllm-ascend's platform and general plugins (entry points)
_activate_registry(_all_patches)


def activate() -> None:
    """Ray `worker_process_setup_hook` entry: importing this module already did the work."""
    _install_npu_emulation()
    _put_dist_info_on_path(_REPO_ROOT)
    _activate_registry(_all_patches)
