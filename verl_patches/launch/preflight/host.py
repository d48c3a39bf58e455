"""Preflight: what only the cluster node can answer (NIC, CANN, NPUs, torch_npu, ports) and the port plan.

On a host without NPUs these are listed as "not checked here" (the launch script's ``--dry-run`` on a
laptop must pass without an env file); on an NPU host a missing MASTER_ADDR or NIC is a failure. The
port plan is arithmetic and is checked everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_patches.base.free_port import ephemeral_range, port_is_free
from verl_patches.base.host_device import detect_host_device
from verl_patches.base.job_layout import JobLayoutError, job_layout
from verl_patches.launch.cluster.ray_cluster import RAY_OWN_PORTS
from verl_patches.launch.preflight.findings import FAIL, NOT_CHECKED, OK, WARN, Context, Finding, HostFacts, get
from verl_patches.launch.settings import SettingsError, validate_address
from verl_patches.rollout.dp_env import DpEnvError, dp_base_port, port_block
from verl_patches.worker_calls.env_names import DP_BASE_PORT_ENV

HCCL_PORTS_PER_NODE = 16  # CANN: HCCL_IF_BASE_PORT occupies 16 ports starting at the base
HCCL_BASE_PORT_MAX = 65520
EPHEMERAL = "this node's ephemeral port range (net.ipv4.ip_local_port_range)"


def probe_host() -> HostFacts:
    """This machine, without importing torch or torch_npu (VERL_PATCHES_DEVICE overrides the device,
    as it does for the device layer)."""

    try:
        interfaces = tuple(name for _, name in socket.if_nameindex())
    except OSError:
        interfaces = ()
    npus = sum(1 for p in Path("/dev").glob("davinci*") if re.fullmatch(r"davinci\d+", p.name))
    addresses: set[str] = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, family=socket.AF_INET):
            addresses.add(str(info[4][0]))
    except OSError:
        pass
    return HostFacts(
        device=detect_host_device(),
        interfaces=interfaces,
        npu_count=npus,
        torch_npu_importable=importlib.util.find_spec("torch_npu") is not None,
        local_addresses=tuple(sorted(addresses)),
    )


def port_in_use(port: int) -> bool:
    """Whether a server could not bind the port now on any address: the job's servers (Ray, the stores) listen
    on the node's NIC, so the probe covers every address; the socket never listens and is closed at once."""
    return not port_is_free("0.0.0.0", port)


def vllm_dp_port_count(cfg: Any) -> int:
    """One DP master port per vLLM DP group (F2: base + 1 + index, the base being MASTER_PORT exported as
    VERL_PATCHES_VLLM_DP_BASE_PORT): instances x rollout TP where an instance has more than one engine
    (`RolloutParallel.dp_groups`, as many as `dp_env.all_group_ports` gives); none for another rollout, or for a
    layout the layout.* findings refuse."""
    if get(cfg, "actor_rollout_ref.rollout.name") != "vllm":
        return 0
    try:
        return job_layout(cfg).rollout.dp_groups
    except JobLayoutError:
        return 0


def port_plan(ctx: Context) -> tuple[dict[str, range], list[Finding]]:
    s = ctx.settings
    plan: dict[str, range] = {}
    errors = []
    for name in ("MASTER_PORT", "RAY_DASHBOARD_PORT", "HCCL_IF_BASE_PORT"):
        try:
            plan[name] = range(s.int(name), s.int(name) + 1)
        except SettingsError as e:
            errors.append(Finding("cluster.port_plan", FAIL, str(e), name))
    if errors:
        return plan, errors
    base = plan["HCCL_IF_BASE_PORT"].start
    plan["HCCL_IF_BASE_PORT"] = range(base, base + HCCL_PORTS_PER_NODE)
    n = vllm_dp_port_count(ctx.cfg)
    if n:
        start = plan["MASTER_PORT"].start + 1
        plan["vLLM DP master ports (MASTER_PORT+1..)"] = range(start, start + n)
    return plan, []


def _span(r: range) -> str:
    return f"{r.start}" if len(r) == 1 else f"{r.start}..{r.stop - 1}"


def port_plan_findings(ctx: Context) -> list[Finding]:
    plan, errors = port_plan(ctx)
    if errors:
        return errors
    out = []
    base = plan["HCCL_IF_BASE_PORT"].start
    if not 1024 <= base <= HCCL_BASE_PORT_MAX:
        out.append(
            Finding(
                "cluster.port_plan",
                FAIL,
                f"HCCL_IF_BASE_PORT={base} must be in 1024..{HCCL_BASE_PORT_MAX}",
                "HCCL_IF_BASE_PORT",
            )
        )
    for name, r in plan.items():
        if r.start < 1024 or r.stop - 1 > 65535:
            out.append(Finding("cluster.port_plan", FAIL, f"{name} {_span(r)} outside 1024..65535", name.split(" ")[0]))
    names = list(plan)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ra, rb = plan[a], plan[b]
            if ra.start < rb.stop and rb.start < ra.stop:
                setting = b.split(" ")[0] if b.isupper() else a.split(" ")[0]
                out.append(Finding("cluster.port_plan", FAIL, f"{a} {_span(ra)} overlaps {b} {_span(rb)}", setting))
    if not out:
        out.append(
            Finding("cluster.port_plan", OK, "; ".join(f"{k} {_span(r)}" for k, r in plan.items()) + " do not overlap")
        )
    return out


def _is_head(ctx: Context) -> bool:
    role = ctx.settings.get("NODE_ROLE")
    return role == "head" or (role in (None, "auto") and ctx.settings.get("MASTER_ADDR") in ctx.host.local_addresses)


def local_dp_port_findings(environ: Mapping[str, str], cfg: Any = None) -> list[Finding]:
    """The tiny run keeps a DP base port the user exported (the cluster launch sets it from MASTER_PORT): the dry
    run refuses a malformed one, and one whose block of DP master ports (one per DP group of ``cfg``) runs past
    65535, as the launch does."""
    if not environ.get(DP_BASE_PORT_ENV):
        return []
    try:
        base = dp_base_port(environ)
        port_block(base, vllm_dp_port_count(cfg) if cfg is not None else 0)  # DP size 1: no DP group, no port
    except DpEnvError as e:
        return [Finding("local.dp_ports", FAIL, str(e), DP_BASE_PORT_ENV)]
    return [Finding("local.dp_ports", OK, f"{DP_BASE_PORT_ENV}={base}: vLLM DP master ports from {base + 1}")]


def cluster_findings(
    ctx: Context,
    port_probe=port_in_use,
    ephemeral: tuple[int, int] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Finding]:
    if not ctx.cluster_profile:
        return [
            Finding("cluster", OK, "local profile: no cluster settings, NIC, CANN or NPUs needed")
        ] + local_dp_port_findings(os.environ if environ is None else environ, ctx.cfg)
    s, npu = ctx.settings, ctx.host.is_npu
    here = "" if npu else f" (this is a {ctx.host.device} host; checked on the NPU nodes)"
    out: list[Finding] = []

    addr = s.get("MASTER_ADDR")
    if not addr:
        out.append(
            Finding(
                "cluster.master_addr",
                FAIL if npu else NOT_CHECKED,
                "MASTER_ADDR is not set: pass --master-addr or MASTER_ADDR=... in --env-file" + here,
                "MASTER_ADDR",
            )
        )
    else:
        try:
            validate_address("MASTER_ADDR", addr, s.where("MASTER_ADDR"))
            if npu:
                socket.getaddrinfo(addr, None)
                out.append(Finding("cluster.master_addr", OK, f"MASTER_ADDR={addr} resolves"))
            else:
                out.append(
                    Finding(
                        "cluster.master_addr",
                        NOT_CHECKED,
                        f"MASTER_ADDR={addr} is well-formed; reachability{here}",
                        "MASTER_ADDR",
                    )
                )
        except SettingsError as e:
            out.append(Finding("cluster.master_addr", FAIL, str(e), "MASTER_ADDR"))
        except OSError as e:
            out.append(Finding("cluster.master_addr", FAIL, f"MASTER_ADDR={addr} does not resolve: {e}", "MASTER_ADDR"))

    nic = s.get("SOCKET_IFNAME")
    if not nic:
        out.append(
            Finding(
                "cluster.socket_ifname",
                FAIL if npu else NOT_CHECKED,
                "SOCKET_IFNAME is not set: pass --socket-ifname or SOCKET_IFNAME=... in --env-file" + here,
                "SOCKET_IFNAME",
            )
        )
    elif not npu:
        out.append(
            Finding("cluster.socket_ifname", NOT_CHECKED, f"SOCKET_IFNAME={nic}: existence{here}", "SOCKET_IFNAME")
        )
    elif nic not in ctx.host.interfaces:
        out.append(
            Finding(
                "cluster.socket_ifname",
                FAIL,
                f"SOCKET_IFNAME={nic} is not an interface of this node "
                f"(found: {', '.join(ctx.host.interfaces) or 'none'})",
                "SOCKET_IFNAME",
            )
        )
    else:
        out.append(Finding("cluster.socket_ifname", OK, f"SOCKET_IFNAME={nic} exists"))

    for name in ("CANN_TOOLKIT_ENV", "CANN_NNAL_ENV"):
        path = s.get(name)
        if not npu:
            out.append(Finding("cluster.cann_env", NOT_CHECKED, f"{name}={path}{here}", name))
        elif not path or not Path(path).is_file():
            out.append(
                Finding("cluster.cann_env", FAIL, f"{name}={path}: no such file (CANN environment script)", name)
            )
        else:
            out.append(Finding("cluster.cann_env", OK, f"{name}={path} exists"))

    try:
        want = s.int("NPUS_PER_NODE")
    except SettingsError as e:
        want = None
        out.append(Finding("cluster.npu_count", FAIL, str(e), "NPUS_PER_NODE"))
    if want is not None:
        if not npu:
            out.append(Finding("cluster.npu_count", NOT_CHECKED, f"NPUS_PER_NODE={want}{here}", "NPUS_PER_NODE"))
        elif ctx.host.npu_count < want:
            out.append(
                Finding(
                    "cluster.npu_count",
                    FAIL,
                    f"this node shows {ctx.host.npu_count} NPU devices (/dev/davinci*), NPUS_PER_NODE={want}",
                    "NPUS_PER_NODE",
                )
            )
        else:
            out.append(Finding("cluster.npu_count", OK, f"{ctx.host.npu_count} NPU devices >= NPUS_PER_NODE={want}"))

    if not npu:
        out.append(Finding("cluster.torch_npu", NOT_CHECKED, f"torch_npu import{here}", "requirements.txt (torch_npu)"))
    elif not ctx.host.torch_npu_importable:
        out.append(
            Finding(
                "cluster.torch_npu",
                FAIL,
                "torch_npu is not installed in this environment",
                "requirements.txt (torch_npu)",
            )
        )
    else:
        out.append(Finding("cluster.torch_npu", OK, "torch_npu is installed"))

    out += port_plan_findings(ctx)
    out += (
        ports_free_findings(ctx, port_probe, ephemeral)
        if npu
        else [
            Finding(
                "cluster.ports_free",
                NOT_CHECKED,
                f"MASTER_PORT, RAY_DASHBOARD_PORT and HCCL ports free{here}",
                "MASTER_PORT / RAY_DASHBOARD_PORT / HCCL_IF_BASE_PORT",
            )
        ]
    )
    return out


def handed_out_findings(plan: dict[str, range], handed_out: dict[str, tuple[int, int]]) -> list[Finding]:
    """Planned ports inside ranges that others hand out by themselves (pure): the node's ephemeral range, from
    which every outgoing connection of the job (Ray, gloo, HCCL, store clients) takes a random local port, and
    Ray's own ports. A planned port there can be held by the job itself when its server starts."""
    out = []
    for what, (low, high) in handed_out.items():
        inside = [(name, r) for name, r in plan.items() if r.start <= high and low <= r.stop - 1]
        if inside:
            out.append(
                Finding(
                    "cluster.ports_handed_out",
                    WARN,
                    ", ".join(f"{name} {_span(r)}" for name, r in inside)
                    + f" inside {what} {low}..{high}: that port can be taken before its server binds it; choose "
                    "ports outside it"
                    + (" (or list them in net.ipv4.ip_local_reserved_ports)" if what == EPHEMERAL else ""),
                    inside[0][0].split(" ")[0],
                )
            )
    return out


def handed_out_ranges(ephemeral: tuple[int, int] | None = None) -> dict[str, tuple[int, int]]:
    """This node's ephemeral range (net.ipv4.ip_local_port_range) and Ray's own ports."""
    eph = ephemeral_range() if ephemeral is None else ephemeral
    return {EPHEMERAL: eph, **RAY_OWN_PORTS}


def ports_free_findings(ctx: Context, port_probe, ephemeral: tuple[int, int] | None = None) -> list[Finding]:
    plan, errors = port_plan(ctx)
    if errors:
        return []
    found = handed_out_findings(plan, handed_out_ranges(ephemeral))
    head = _is_head(ctx)
    busy = []
    for name, r in plan.items():
        if name == "HCCL_IF_BASE_PORT" or head:
            busy += [(name.split(" ")[0], p) for p in r if port_probe(p)]
    if busy:
        return found + [
            Finding(
                "cluster.ports_free",
                WARN,
                "in use on this node: "
                + ", ".join(f"{p} ({n})" for n, p in busy[:5])
                + " (another job, or a Ray cluster left running?)",
                busy[0][0],
            )
        ]
    return found + [
        Finding(
            "cluster.ports_free",
            OK,
            "the planned ports are free on this node" + (" (head)" if head else " (worker: HCCL ports only)"),
        )
    ]
