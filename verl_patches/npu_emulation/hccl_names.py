"""HCCL communicator names on a CPU host.

The MC2 ops (`npu_moe_distribute_dispatch` / `_combine`) name their expert-parallel group by the HCCL
communicator name vllm-ascend reads from ``backend.get_hccl_comm_name(rank)``, not by a ProcessGroup. Gloo
groups have no such name, so this registry gives a group one and finds the group again from it. The table is
per process; every rank of a group registers the group under the same name before the first dispatch.
"""

from __future__ import annotations

import torch.distributed as dist

NAME_PREFIX = "gloo_as_hccl:"  # names made by name_for_group; anything else was registered by hand

_GROUPS: dict[str, dist.ProcessGroup] = {}


def register_group(name: str, group: dist.ProcessGroup) -> str:
    """Register `group` under `name` (idempotent for the same group); returns the name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"hccl_names: a communicator name must be a non-empty string, got {name!r}")
    known = _GROUPS.get(name)
    if known is not None and known is not group:
        raise ValueError(f"hccl_names: {name!r} already names another process group")
    _GROUPS[name] = group
    return name


def name_for_group(group: dist.ProcessGroup) -> str:
    """The group's communicator name (from its torch group name, so every rank of it derives the same one),
    registered here."""
    return register_group(NAME_PREFIX + group.group_name, group)


def group_named(name: str | None, op: str = "hccl_names") -> dist.ProcessGroup:
    """The group registered under `name`; the error says what to register when there is none."""
    if not name:
        raise ValueError(
            f"{op}: the HCCL communicator name is {name!r}. vllm-ascend got none from "
            "backend.get_hccl_comm_name (a gloo group has none); on a CPU host register the EP group with "
            "verl_patches.npu_emulation.hccl_names.name_for_group(group) and hand that name to the op"
        )
    group = _GROUPS.get(name)
    if group is None:
        raise KeyError(
            f"{op}: no process group is registered under the HCCL communicator name {name!r} "
            f"(registered: {sorted(_GROUPS) or 'none'}); register it with "
            "verl_patches.npu_emulation.hccl_names.register_group(name, group) on every rank of the group"
        )
    return group


def registered_names() -> list[str]:
    return sorted(_GROUPS)


def forget(name: str) -> None:
    """Drop one name (a destroyed group must not be found again)."""
    _GROUPS.pop(name, None)
