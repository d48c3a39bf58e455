"""Preflight ``env.vendor``: the vendor recipe's variables that work differently here, each refused or mapped by name.

A cluster team brings the vendor's scripts' exports (reference §3) with it. Most are read here as there (the
HCCL_*/ASCEND_* settings, PRINT_MEMORY, D2D_DATA_TRANSFER, ...) and need no word. These do not: nothing in this
stack reads them, or the launcher sets them from a config key or setting. Each one that is set gets one line:

* refused (``fail``), naming the key or setting to use, when its value asks for something this run would not
  do (graph mode off while the config has it on, the rollout's forced balanced routing, MC2 off, ...): the
  launch does not start, as the dry run says;
* mapped (``warn``) when its value is what happens here anyway: the line names where that is decided and says
  the variable can go.

The values are the launching shell's environment and the env file's pass-through lines (which win, as in
the job's environment); switches and numbers are read with `base.env_flags`, so a misspelt value is refused
with the accepted spellings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from verl_patches.base.env_flags import EnvError, env_int, parse_flag
from verl_patches.base.overlay_settings import VLLM_DP_KEY as DP_SIZE_KEY
from verl_patches.base.overlay_settings import overlay_settings
from verl_patches.launch.preflight.env import Seen, seen_by_the_job
from verl_patches.launch.preflight.findings import FAIL, OK, WARN, Context, Finding, get
from verl_patches.launch.settings import ClusterSettings

CHECK = "env.vendor"
GRAPH_MODE_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.enabled"
FIX_ROUTER_KEY = "actor_rollout_ref.actor.megatron.fix_router"


def _on_off(on: bool) -> str:
    return "on" if on else "off"


def _graph_mode(v: Seen, cfg: object) -> Finding:
    here = bool(get(cfg, GRAPH_MODE_KEY, False))
    wanted = parse_flag(v.name, v.value)
    mapping = (
        f"{v.name} is the vendor's switch; here torchair graph mode is {GRAPH_MODE_KEY} (on in the A3 profiles; "
        f"{_on_off(here)} in this config) and nothing reads the variable"
    )
    if wanted == here:
        return Finding(CHECK, WARN, f"{mapping}: remove {v.shown()}", v.name)
    return Finding(
        CHECK, FAIL, f"{v.shown()} asks for graph mode {_on_off(wanted)}, but {mapping}: set the key", GRAPH_MODE_KEY
    )


def _fix_route(v: Seen, cfg: object) -> Finding:
    text = (
        f"{v.name} is the vendor's balanced rollout routing (a patch of its vllm-ascend release candidate), which "
        f"vllm-ascend 0.9.1 has no counterpart for; the training side's round-robin router is {FIX_ROUTER_KEY} "
        f"({_on_off(bool(get(cfg, FIX_ROUTER_KEY, False)))} in this config; on in a3_256die_random_init)"
    )
    if parse_flag(v.name, v.value):
        return Finding(
            CHECK,
            FAIL,
            f"{v.shown()}: {text}; the rollout cannot be routed evenly here: remove the variable (compare the "
            "random-init run's training throughput with the vendor's, not its rollout's)",
            v.name,
        )
    return Finding(CHECK, WARN, f"{text}: {v.shown()} changes nothing; remove it", v.name)


def _mc2(v: Seen, _cfg: object) -> Finding:
    text = (
        f"{v.name} is read by nothing (nor by the vendor's vllm-ascend): vllm-ascend 0.9.1 takes MC2 by itself "
        "in decode steps when the expert-parallel size is 16 or more (the A3 profiles' rollout EP is)"
    )
    if parse_flag(v.name, v.value):
        return Finding(CHECK, WARN, f"{text}; remove {v.shown()}", v.name)
    return Finding(CHECK, FAIL, f"{v.shown()} asks for MC2 off, but {text}: it cannot be switched off here", v.name)


def _acl_op_init(v: Seen, _cfg: object) -> Finding:
    return Finding(
        CHECK,
        WARN,
        f"{v.shown()}: read by nothing here (nor by the vendor's vllm-ascend release candidate); remove it",
        v.name,
    )


def _rebalance(v: Seen, _cfg: object) -> Finding:
    if parse_flag(v.name, v.value):
        return Finding(
            CHECK,
            FAIL,
            f"{v.shown()}: the vendor's rollout rebalance is not carried here (verl_patches/rollout/rebalance says "
            "why); remove the variable",
            v.name,
        )
    return Finding(
        CHECK, WARN, f"{v.shown()}: the rollout rebalance is not carried here, so it is off; remove it", v.name
    )


def _dp_size(v: Seen, cfg: object) -> Finding:
    here = overlay_settings(cfg).vllm_dp_size
    value = env_int(v.name, 0, environ={v.name: v.value})
    text = f"the job exports {v.name} from {DP_SIZE_KEY} ({here} in this config)"
    if here is not None and value == int(here):
        return Finding(CHECK, WARN, f"{v.shown()}: {text}; remove it", v.name)
    return Finding(CHECK, FAIL, f"{v.shown()} differs: {text}; set the key instead", DP_SIZE_KEY)


HANDLERS: dict[str, Callable[[Seen, object], Finding]] = {
    "VLLM_ENABLE_GRAPH_MODE": _graph_mode,
    "VLLM_ENABLE_FIX_ROUTE": _fix_route,
    "VLLM_ENABLE_MC2": _mc2,
    "VLLM_ASCEND_ACL_OP_INIT_MODE": _acl_op_init,
    "ROLLOUT_REBALANCE_ENABLE": _rebalance,
    "VLLM_DP_SIZE": _dp_size,
}


def _world_size(v: Seen, world: int | None) -> Finding:
    value = env_int(v.name, 0, environ={v.name: v.value})
    text = f"the job exports {v.name} as NNODES x NPUS_PER_NODE" + (f" ({world})" if world else "")
    if world is not None and value == world:
        return Finding(CHECK, WARN, f"{v.shown()}: {text}; remove it", v.name)
    return Finding(CHECK, FAIL, f"{v.shown()} differs: {text}; set those instead", "NNODES, NPUS_PER_NODE")


def _jemalloc(v: Seen) -> Finding:
    return Finding(
        CHECK,
        WARN,
        f"{v.shown()}: the vendor preloads jemalloc by hand; here the JEMALLOC_LIB setting does (auto finds it; none "
        "turns it off) and the job's LD_PRELOAD replaces this one",
        "JEMALLOC_LIB",
    )


def vendor_findings(
    seen: Mapping[str, Seen], cfg: object, world_size: int | None = None, cluster: bool = True
) -> list[Finding]:
    """One finding per vendor variable in ``seen`` that works differently here (pure); one ``ok`` line when none
    is set. ``world_size`` is NNODES x NPUS_PER_NODE when the settings give it; ``cluster`` False (the tiny run
    on this host) skips WORLD_SIZE, which only the cluster job exports."""
    out: list[Finding] = []
    for name in sorted(seen):
        v = seen[name]
        try:
            if name in HANDLERS:
                out.append(HANDLERS[name](v, cfg))
            elif name == "WORLD_SIZE" and cluster:
                out.append(_world_size(v, world_size))
            elif name == "LD_PRELOAD" and "jemalloc" in v.value:
                out.append(_jemalloc(v))
        except EnvError as err:
            out.append(Finding(CHECK, FAIL, f"{err} ({v.where})", name))
    return out or [Finding(CHECK, OK, "none of the vendor's variables that work differently here is set")]


def seen_variables(settings: ClusterSettings, environ: Mapping[str, str]) -> dict[str, Seen]:
    """The vendor variables the job would see: the launching environment's, then the env file's pass-through
    lines (which win)."""
    names = set(HANDLERS) | {"WORLD_SIZE", "LD_PRELOAD"}
    return seen_by_the_job(environ, settings, names.__contains__)


def vendor_env_findings(ctx: Context, environ: Mapping[str, str]) -> list[Finding]:
    """The preflight's ``env.vendor`` lines for this config, settings and launching environment."""
    try:
        world = ctx.settings.world_size
    except ValueError:  # NNODES or NPUS_PER_NODE not a number: the settings check names it
        world = None
    return vendor_findings(seen_variables(ctx.settings, environ), ctx.cfg, world, ctx.cluster_profile)


__all__ = ["CHECK", "GRAPH_MODE_KEY", "Seen", "seen_variables", "vendor_env_findings", "vendor_findings"]
