"""Preflight ``env.variables``: every variable of the registry the job would see, parsed as the job parses it.

A value the job would die on (``VERL_PATCHES_QUIET=2`` stops every patched process at import; ``PRINT_MEMORY=enabled``,
``VERL_PATCHES_COLLECTIVE_TIMEOUT_S=abc`` stop the workers that read them) is refused here, in one line naming the
variable, the value and what is accepted: the parser is the registry's (`base.env_registry`), the one the job's
getters use. The values are the launching environment's and the env file's pass-through lines (which win, as in the
job's environment).

Besides the parse:

* a variable that looks like ours (``VERL_PATCHES_*``, ``VERL_OVERLAY_*``, ``VERL_LAUNCH_*``) and is not registered
  is a typo or a variable nothing reads: a warning naming the closest registered name;
* ``VLLM_DP_MASTER_PORT`` set by hand turns off F2's per-rank export (`rollout.verl_hooks`): no rank exports its
  own ``VLLM_DP_RANK`` or master address, so with a DP size above 1 every rank would take itself for DP rank 0 and
  the groups could not form: refused; with DP size 1 nothing reads it: a warning;
* on a cluster profile the launch exports ``VERL_PATCHES_VLLM_DP_BASE_PORT`` from ``MASTER_PORT``, so a value in
  the environment is ignored: a warning (the tiny run keeps it; ``local.dp_ports`` checks its port block).

Variables another check judges itself (the vendor's, ``env.vendor``) are left to it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from verl_patches.base.env_registry import closest, lookup, problem, unregistered_ours
from verl_patches.base.overlay_settings import VLLM_DP_KEY as DP_SIZE_KEY
from verl_patches.launch.preflight.findings import FAIL, OK, WARN, Context, Finding
from verl_patches.launch.settings import SETTING_NAMES, ClusterSettings
from verl_patches.worker_calls.env_names import DP_BASE_PORT_ENV

CHECK = "env.variables"
DP_MASTER_PORT = "VLLM_DP_MASTER_PORT"


@dataclass(frozen=True)
class Seen:
    """A variable as the job would see it: its value and where it came from."""

    name: str
    value: str
    where: str

    def shown(self) -> str:
        return f"{self.name}={self.value!r} ({self.where})"


def seen_by_the_job(
    environ: Mapping[str, str],
    settings: ClusterSettings | None,
    wanted: Callable[[str], bool],
    typos: Collection[str] = (),
) -> dict[str, Seen]:
    """What the job would see of the variables ``wanted`` names: the launching environment's (and there the
    ``typos`` too, to be named), then the env file's pass-through lines (they win, as in `job_env.job_environment`).
    The one reading of the two sources, for this check and ``env.vendor``."""
    out = {n: Seen(n, v, "environment") for n, v in environ.items() if n in typos or wanted(n)}
    if settings is not None:
        for key, value in settings.values.items():
            if wanted(key) and key not in SETTING_NAMES and settings.where(key) not in ("environment", "default"):
                out[key] = Seen(key, value, settings.where(key))
    return out


def seen_variables(settings: ClusterSettings | None, environ: Mapping[str, str]) -> dict[str, Seen]:
    """The registered variables, and the ones that look like ours, of the launching environment; then the env
    file's pass-through lines of registered variables."""
    typos = set(unregistered_ours(environ))
    return seen_by_the_job(environ, settings, lambda name: lookup(name) is not None, typos)


def dp_master_port_findings(seen: Mapping[str, Seen], dp_size: int) -> list[Finding]:
    """``VLLM_DP_MASTER_PORT`` when ``seen`` holds it (pure): set by hand it turns off the per-rank export of
    VLLM_DP_*; refused when the config's vLLM DP size is above 1 (the groups could not form), else a warning."""
    if DP_MASTER_PORT not in seen:
        return []
    v = seen[DP_MASTER_PORT]
    does = (
        f"{v.shown()} is set by hand, which turns off the per-rank export of VLLM_DP_* "
        "(verl_patches/rollout/verl_hooks.py): no rank exports its own VLLM_DP_RANK, VLLM_DP_MASTER_IP or "
        "VLLM_DP_MASTER_PORT"
    )
    if dp_size > 1:
        return [
            Finding(
                CHECK,
                FAIL,
                f"{does}, so with {DP_SIZE_KEY}={dp_size} every rank would take itself for DP rank 0 and the DP "
                f"groups could not form: unset it (the job gives each DP group its own port from {DP_BASE_PORT_ENV})",
                DP_MASTER_PORT,
            )
        ]
    return [Finding(CHECK, WARN, f"{does}; with {DP_SIZE_KEY}={dp_size} nothing reads it: remove it", DP_MASTER_PORT)]


def variable_findings(seen: Mapping[str, Seen], dp_size: int | None = None, cluster: bool = False) -> list[Finding]:
    """One finding per variable of ``seen`` that the job would refuse or that does not do what it seems to (pure);
    one ``ok`` line when there is none. ``dp_size`` is the config's vLLM DP size (None before the config is
    composed: ``VLLM_DP_MASTER_PORT`` is left out); ``cluster``: an A3 profile."""
    out: list[Finding] = []
    parsed = 0
    for name in sorted(seen):
        v = seen[name]
        var = lookup(name)
        if var is None:
            near = closest(name)
            hint = f"; did you mean {near}?" if near else "; nothing reads it"
            out.append(Finding(CHECK, WARN, f"{name} ({v.where}) is not a variable this project reads{hint}", name))
        elif name == DP_MASTER_PORT:
            out += dp_master_port_findings(seen, dp_size) if dp_size is not None else []
        elif name == DP_BASE_PORT_ENV and cluster:
            out.append(
                Finding(
                    CHECK,
                    WARN,
                    f"{v.shown()} is ignored on the cluster: the launch exports {name} from the MASTER_PORT setting "
                    "(the vLLM DP master ports are MASTER_PORT + 1 onwards); set MASTER_PORT instead",
                    "MASTER_PORT",
                )
            )
        elif not var.judged_by:
            refusal = problem(name, v.value)
            parsed += 1
            if refusal:
                out.append(Finding(CHECK, FAIL, f"{refusal} ({v.where})", name))
    if not out:
        out.append(Finding(CHECK, OK, f"{parsed} variable(s) of the registry set, each a value the job accepts"))
    return out


def env_variable_findings(ctx: Context, environ: Mapping[str, str]) -> list[Finding]:
    """The preflight's ``env.variables`` lines for this config, settings and launching environment."""
    dp_size = 1 if ctx.layout is None else ctx.layout.rollout.dp_per_instance  # the layout check names a bad one
    return variable_findings(seen_variables(ctx.settings, environ), dp_size, ctx.cluster_profile)


__all__ = [
    "CHECK",
    "Seen",
    "dp_master_port_findings",
    "env_variable_findings",
    "seen_by_the_job",
    "seen_variables",
    "variable_findings",
]
