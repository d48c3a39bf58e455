"""Subfolders a device's jobs import that a route's tree may lack (the lock's ``subfolders_needed_on``).

A tree hash proves a folder is exactly what one route pins, not that the route pins enough: megatron-core's
PyPI wheel is a faithful `megatron/core` without `megatron/training`, which MindSpeed-LLM imports on A3. Such a
tree is refused by name wherever it would reach an NPU host: in an export for an air-gapped cluster, in a setup
on an NPU host, and by `--verify` there.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from verl_patches.sources.lock import Component


def missing_subfolders(comp: Component, folder: Path, devices: Iterable[str]) -> dict[str, list[str]]:
    """``{device: [subfolder, ...]}`` the tree at `folder` lacks for each of `devices` ({} when none).

    A subfolder counts only as a real folder (a symbolic link in its place is missing: it would point out of
    the tree the hash describes)."""
    out: dict[str, list[str]] = {}
    for device in devices:
        lacking = [
            sub
            for sub in comp.subfolders_needed_on.get(device, ())
            if (folder / sub).is_symlink() or not (folder / sub).is_dir()
        ]
        if lacking:
            out[device] = lacking
    return out


def describe_missing(comp: Component, missing: dict[str, list[str]]) -> str:
    """One line: which subfolders, for which devices, and how to get a complete tree."""
    parts = "; ".join(
        f"{', '.join(f'{comp.package}/{s}' for s in subs)} (imported by {device} jobs)"
        for device, subs in sorted(missing.items())
    )
    return (
        f"{comp.package}/ lacks {parts}: this tree cannot run there; use the git route (or --mirror "
        f"{comp.name}=<a local clone>) or a cache exported from git"
    )


__all__ = ["missing_subfolders", "describe_missing"]
