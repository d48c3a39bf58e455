"""F2: vLLM data-parallel groups for expert parallelism in the rollout (VLLM_DP_* per rank).

vllm-ascend 0.9.1 reads the DP layout from the environment (its ParallelConfig patch:
VLLM_DP_SIZE, VLLM_DP_RANK, VLLM_DP_MASTER_IP, VLLM_DP_MASTER_PORT). verl launches every rank itself
(`external_launcher`), so each rank must export its own values before the engine is built.

Layout (vLLM's `initialize_model_parallel`: ranks reshaped as [instance, dp, pp=1, tp]): rank g is in
instance `g // (dp*tp)`, has DP rank `(g % (dp*tp)) // tp` and TP rank `g % tp`. One DP group per
(instance, TP rank); its master is its lowest rank; its port is `base_port + 1 + instance*tp + tp_rank`,
distinct for every group of the job (the vendor's `r0 // dp_world + r0 % dp_world` gives two instances
the same port). The master address is the master rank's host address, found from the kernel
(HCCL_SOCKET_IFNAME / SOCKET_IFNAME interface) or the host name, never by probing the internet.
Free ports are checked by binding on each master's host at init time.

The base port comes from VERL_PATCHES_VLLM_DP_BASE_PORT, which the launch exports (the cluster's MASTER_PORT
setting, which the preflight checks with its +1.. ports; the tiny run's block outside the ephemeral range),
never from MASTER_PORT inside a worker: verl's rank 0 replaces that with torch.distributed's port, one the
kernel handed out from its ephemeral range, and the ports after it are anyone's (an outgoing connection of
the job itself can hold one).

Pure planning: `dp_assignment`, `all_group_ports`, `port_block`, `dp_base_port` (from a mapping). Execution:
`host_address`, `check_port_free`, `export_env`, `init_vllm_dp_env` (needs torch.distributed initialised).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from verl_patches.base import env_registry, node_ip
from verl_patches.base.env_flags import EnvError
from verl_patches.base.free_port import port_is_free
from verl_patches.reshard.layout import RolloutLayout
from verl_patches.worker_calls.env_names import DP_BASE_PORT_ENV  # DP master ports are this + 1 onwards

IFNAME_ENVS = ("HCCL_SOCKET_IFNAME", "SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


class DpEnvError(RuntimeError):
    """Bad DP layout, address or port; the message names the rank, setting or port at fault."""


@dataclass(frozen=True)
class DpAssignment:
    rank: int
    instance: int
    dp_rank: int
    dp_size: int
    tp_rank: int
    group_index: int  # distinct per DP group over the whole job
    master_rank: int  # global rank of the group's DP rank 0
    port: int

    def env(self, master_ip: str) -> dict[str, str]:
        return {
            "VLLM_DP_SIZE": str(self.dp_size),
            "VLLM_DP_RANK": str(self.dp_rank),
            "VLLM_DP_RANK_LOCAL": str(self.dp_rank),
            "VLLM_DP_MASTER_IP": master_ip,
            "VLLM_DP_MASTER_PORT": str(self.port),
        }


def dp_assignment(rank: int, layout: RolloutLayout, base_port: int) -> DpAssignment:
    """Where global `rank` sits in vLLM's DP groups, and its group's master rank and port."""
    if not 0 <= rank < layout.world_size:
        raise DpEnvError(f"rank {rank} outside world size {layout.world_size}")
    tp, dp = layout.tp, layout.dp_per_instance
    instance, local = divmod(rank, tp * dp)
    dp_rank, tp_rank = divmod(local, tp)
    group_index = instance * tp + tp_rank
    port = base_port + 1 + group_index
    if port > 65535 or base_port + 1 < 1024:
        raise DpEnvError(
            f"rank {rank}: DP master port {port} ({DP_BASE_PORT_ENV} {base_port} + 1 + {group_index}) "
            "outside 1024..65535"
        )
    return DpAssignment(
        rank=rank,
        instance=instance,
        dp_rank=dp_rank,
        dp_size=dp,
        tp_rank=tp_rank,
        group_index=group_index,
        master_rank=instance * tp * dp + tp_rank,
        port=port,
    )


def dp_base_port(environ: Mapping[str, str] | None = None) -> int:
    """The DP ports' base, from VERL_PATCHES_VLLM_DP_BASE_PORT (the launch exports it)."""
    if not env_registry.is_set(DP_BASE_PORT_ENV, environ):
        raise DpEnvError(
            f"{DP_BASE_PORT_ENV} is not set: with VLLM_DP_SIZE > 1 the launch exports it (the MASTER_PORT setting; "
            f"vLLM's DP master ports are it +1 onwards); MASTER_PORT inside a verl worker is torch.distributed's "
            f"random port and cannot serve as the base. Set it, or set VLLM_DP_MASTER_PORT yourself"
        )
    try:
        return env_registry.integer(DP_BASE_PORT_ENV, environ)  # 1023..65534, as the dry run parses it
    except EnvError as e:
        raise DpEnvError(str(e)) from None


def port_block(base_port: int, groups: int) -> range:
    """The DP master ports of ``groups`` DP groups from ``base_port`` (``base + 1 .. base + groups``, as
    `dp_assignment` hands them out); DpEnvError, naming the variable, when the block runs past 65535."""
    block = range(base_port + 1, base_port + 1 + groups)
    if groups and block[-1] > 65535:
        raise DpEnvError(
            f"{DP_BASE_PORT_ENV}={base_port}: its {groups} DP master ports {block[0]}..{block[-1]} run past 65535; "
            f"set it to at most {65535 - groups}"
        )
    return block


def all_group_ports(layout: RolloutLayout, base_port: int) -> dict[int, int]:
    """DP group master rank -> port for the whole job; raises if two groups would share a port."""
    ports: dict[int, int] = {}
    for rank in range(layout.world_size):
        a = dp_assignment(rank, layout, base_port)
        if ports.setdefault(a.master_rank, a.port) != a.port:
            raise DpEnvError(f"rank {rank}: group of master {a.master_rank} got two ports")
    if len(set(ports.values())) != len(ports):
        raise DpEnvError(f"DP groups share ports: {sorted(ports.values())}")
    return ports


def host_address(environ: Mapping[str, str] | None = None) -> str:
    """This host's address for the DP master: the NIC named by HCCL_SOCKET_IFNAME (or SOCKET_IFNAME,
    GLOO_SOCKET_IFNAME), else the address the host name resolves to. No packet leaves the host."""
    env = os.environ if environ is None else environ
    for key in IFNAME_ENVS:
        name = env.get(key, "").split(",")[0].strip()
        if name:
            try:
                return node_ip.interface_ipv4(name)
            except node_ip.NetworkError as e:
                raise DpEnvError(f"{key}: {e}") from None
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as e:
        raise DpEnvError(
            f"host name {socket.gethostname()!r} does not resolve ({e}); set HCCL_SOCKET_IFNAME "
            f"to the NIC the DP groups should use"
        ) from None


def check_port_free(host: str, port: int, rank: int) -> None:
    """The DP master binds this port next (a TCPStore, which sets SO_REUSEADDR), so it must be free now."""
    if not port_is_free(host, port):
        raise DpEnvError(
            f"rank {rank}: vLLM DP master port {port} on {host} is in use; choose another {DP_BASE_PORT_ENV} "
            f"(the MASTER_PORT setting on a cluster; DP ports are it +1 onwards)"
        )


def export_env(
    assignment: DpAssignment, master_ip: str, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    values = assignment.env(master_ip)
    (os.environ if environ is None else environ).update(values)
    return values


def init_vllm_dp_env(
    tp: int, dp: int, base_port: int, group=None, environ: MutableMapping[str, str] | None = None
) -> DpAssignment:
    """Every rank of the job calls this once before building its engine (collective over `group`)."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch.distributed as dist

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    try:
        layout = RolloutLayout(world_size=world, tp=tp, dp_per_instance=dp)
    except ValueError as e:
        raise DpEnvError(f"rank {rank}: rollout TP {tp} x VLLM_DP_SIZE {dp}: {e}") from None
    all_group_ports(layout, base_port)  # distinct, in range: the same answer on every rank
    me = dp_assignment(rank, layout, base_port)
    addresses: list[str | None] = [None] * world
    dist.all_gather_object(addresses, host_address(environ), group=group)
    if rank == me.master_rank:
        check_port_free(addresses[rank] or "", me.port, rank)
    dist.barrier(group=group)
    export_env(me, addresses[me.master_rank] or "", environ)
    return me
