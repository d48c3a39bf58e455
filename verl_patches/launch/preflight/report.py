"""Preflight: everything that can be known before a job starts, each finding naming what to change.

``python -m verl_patches.launch.preflight [--profile a3_256die_true_weight|a3_256die_random_init|tiny]
[--env-file F] [--master-addr A] [--nnodes N] [--npus-per-node N] [--json] [hydra overrides...]``

Checks: sources against sources.lock, every declared patch against the pinned upstream source, the
parallel layout and batch arithmetic, data files and their schema, the model config, the Megatron
checkpoint, the checkpoint folder (named, absolute, writable, room; the step a resume would take) and the
cadence and cost of saves and validation, the cluster node (NIC, CANN, NPUs, torch_npu, ports) and a per-die
memory estimate. Exit
status 0 when nothing failed, 1 when something did, 2 for bad usage or a config that does not compose.
Checks that only the cluster can answer are "not-checked-here" on other hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verl_patches.base.env_flags import EnvError
from verl_patches.base.finite_float import float_arg
from verl_patches.launch.preflight.checkpoint import checkpoint_folder_findings
from verl_patches.launch.preflight.env import env_variable_findings
from verl_patches.launch.preflight.files import checkpoint_findings, data_findings, model_findings
from verl_patches.launch.preflight.findings import FAIL, NOT_CHECKED, OK, STATUSES, WARN, Context, Finding, HostFacts
from verl_patches.launch.preflight.host import cluster_findings, probe_host
from verl_patches.launch.preflight.layout import layout_findings
from verl_patches.launch.preflight.mc2 import mc2_buffer_findings
from verl_patches.launch.preflight.memory import memory_findings
from verl_patches.launch.preflight.memory_estimate import ATLAS_A3_DIE, GIB, DieSpec
from verl_patches.launch.preflight.rank_table import rank_layout_json, rank_layout_text, rank_tables_for_config
from verl_patches.launch.preflight.run_end import run_end_findings
from verl_patches.launch.preflight.validation import validation_findings
from verl_patches.launch.preflight.vendor_env import vendor_env_findings
from verl_patches.launch.run_dir import LogDirError, check_log_root
from verl_patches.launch.settings import (
    ALLOW_REMOTE_DASHBOARD_FLAG,
    AS_WRITTEN_PATH_SETTINGS,
    CONFIG_PATH_SETTINGS,
    SETTING_NAMES,
    SETTINGS,
    ClusterSettings,
    SettingsError,
    cluster_setting_problems,
    config_path_value,
    load_settings,
)
from verl_patches.patches import catalog
from verl_patches.patching import static_report
from verl_patches.sources.lock import LockError, load_lock
from verl_patches.sources.report import sources_report
from verl_patches.trainer.config_compose import (
    CONFIG_NAMES,
    ConfigCompositionError,
    check_integer_overrides,
    compose_config,
    resolved,
)
from verl_patches.trainer.profiles import PROFILES

REPO_ROOT = Path(__file__).resolve().parents[3]
PATH_SETTINGS = CONFIG_PATH_SETTINGS  # read by the profiles through ${oc.env:...}
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
NO_PROFILE = (
    f"which run? give --profile {', '.join(PROFILES)} (or --config-name for a config without a profile); "
    "train_*.sh --dry-run passes its own"
)


# ---- sources and patches ------------------------------------------------------------------------


def sources_findings(root: Path, host: HostFacts) -> tuple[list[Finding], dict[str, dict]]:
    """One finding per component of sources.lock (the logic of ``setup_sources.sh --verify``)."""

    try:
        lock = load_lock(root / "sources.lock")
    except LockError as e:
        return [Finding("sources", FAIL, str(e), "sources.lock")], {}
    comps = sources_report(root, lock, host.device, with_diff=False)["components"]
    out = []
    for c in comps:
        fix = f"bash setup_sources.sh --only {c['name']}"
        where = f"{c['ref']} @ {c['commit'][:12]}"
        if c["status"] == "match":
            out.append(
                Finding(
                    f"sources.{c['name']}",
                    OK,
                    f"{c['package']}/ matches the lock ({where}, route {c['origin_route'] or c['route'] or '-'})",
                )
            )
        elif c["status"] == "missing" and c["optional_here"]:
            out.append(
                Finding(
                    f"sources.{c['name']}",
                    NOT_CHECKED,
                    f"{c['package']}/ not installed; this {host.device} "
                    f"host does not need it (needed on "
                    f"{', '.join(c['needed_on'])})",
                    fix,
                )
            )
        elif c["status"] == "missing":
            out.append(Finding(f"sources.{c['name']}", FAIL, f"{c['package']}/ is missing ({where})", fix))
        else:
            detail = "; ".join(c["problems"][:3]) or "tree hash differs"
            out.append(
                Finding(
                    f"sources.{c['name']}", FAIL, f"{c['package']}/ differs from the lock: {detail}", fix + " --force"
                )
            )
    return out, {c["package"]: c for c in comps}


def patch_findings(root: Path, components: dict[str, dict]) -> list[Finding]:
    """Every declared patch against the pinned source (verl_patches.patching.static_report)."""
    out, fine, unpinned = [], 0, 0
    for p in static_report.static_patch_report(root, catalog.all_patches()):
        key = f"verl_patches/patches (patch {p['name']})"
        pkg = p["target"].partition(":")[0].partition(".")[0]
        comp = components.get(pkg)
        if p["status"] == "ok":
            fine += 1
        elif p["status"] == "unpinned":
            unpinned += 1
        elif p["status"] == "target-missing" and comp and comp["status"] == "missing" and comp["optional_here"]:
            out.append(Finding("patches", NOT_CHECKED, f"{p['name']}: {p['detail']}", key))
        else:
            out.append(Finding("patches", FAIL, f"{p['name']} ({p['status']}): {p['detail']}", key))
    out.insert(
        0,
        Finding(
            "patches",
            OK,
            f"{fine} patch(es) match their pinned upstream source; {unpinned} target "
            f"packages outside the lock (nothing to fingerprint)",
        ),
    )
    return out


# ---- the run -------------------------------------------------------------------------------------


def settings_findings(ctx: Context, allow_remote_dashboard: bool = False) -> list[Finding]:
    """The launch's own check of the cluster settings (`settings.cluster_setting_problems`), so the dry run
    refuses every value the launch refuses. A missing value is left to the cluster checks, which report
    it as not checked on a host that does not run the job."""
    if not ctx.cluster_profile:
        return []
    problems = [
        p
        for p in cluster_setting_problems(
            ctx.settings, needs_checkpoint=False, allow_remote_dashboard=allow_remote_dashboard
        )
        if not p.missing
    ]
    found = (
        [Finding("cluster.settings", OK, "every cluster setting given is one the launch accepts")]
        if not problems
        else [Finding("cluster.settings", FAIL, p.message, p.name) for p in problems]
    )
    return found + log_dir_findings(ctx.settings, ctx.root)


def log_dir_findings(settings: ClusterSettings, root: Path) -> list[Finding]:
    """The launch refuses a LOG_DIR others can replace things in (`run_dir.check_log_root`); so does the dry run."""

    log_root = Path(settings.get("LOG_DIR") or "logs")
    log_root = log_root if log_root.is_absolute() else root / log_root
    if not log_root.is_dir():
        return [Finding("launch.log_dir", OK, f"LOG_DIR {log_root}: created by the launch")]
    try:
        warning = check_log_root(log_root)
    except LogDirError as err:
        return [Finding("launch.log_dir", FAIL, str(err), "LOG_DIR")]
    return [
        Finding(
            "launch.log_dir",
            WARN if warning else OK,
            warning or f"LOG_DIR {log_root}: only yours to write",
            "LOG_DIR" if warning else "",
        )
    ]


def run_preflight(
    cfg: DictConfig,
    settings: ClusterSettings,
    root: Path,
    host: HostFacts,
    die: DieSpec = ATLAS_A3_DIE,
    allow_remote_dashboard: bool = False,
) -> list[Finding]:
    """Every check, in report order. ``cfg`` must be resolved (``config_compose.resolved``)."""

    ctx = Context(cfg=cfg, settings=settings, root=Path(root), host=host)
    found, components = sources_findings(ctx.root, host)
    found += patch_findings(ctx.root, components)
    model_found, model = model_findings(ctx)
    try:
        layout_found, _ = layout_findings(ctx, model)
    except (TypeError, ValueError, KeyError) as e:  # a missing or non-numeric key in an overridden config
        layout_found = [Finding("layout", FAIL, f"could not evaluate the layout: {type(e).__name__}: {e}", "")]
    found += layout_found
    found += data_findings(ctx) + model_found + checkpoint_findings(ctx, model)
    found += checkpoint_folder_findings(ctx, model) + validation_findings(ctx) + run_end_findings(ctx)
    found += settings_findings(ctx, allow_remote_dashboard) + vendor_env_findings(ctx, os.environ)
    found += env_variable_findings(ctx, os.environ)  # every registered variable, parsed as the job parses it
    found += cluster_findings(ctx)
    blocking = {"layout", "layout.megatron_parallel", "layout.layer_list", "layout.vllm_dp_size", "layout.rollout_tp"}
    if any(f.status == FAIL and f.check in blocking for f in layout_found):
        found.append(Finding("memory", WARN, "skipped: the layout is invalid (see the layout.* failures)", ""))
    else:
        found += memory_findings(ctx, model, die) + mc2_buffer_findings(ctx, model)
    return found


def exit_status(findings: list[Finding]) -> int:
    return EXIT_FAIL if any(f.status == FAIL for f in findings) else EXIT_OK


def summary(findings: list[Finding]) -> dict[str, Any]:
    counts = {s: sum(1 for f in findings if f.status == s) for s in STATUSES}
    return {
        "passed": exit_status(findings) == EXIT_OK,
        "counts": counts,
        "failed": sorted({f.check for f in findings if f.status == FAIL}),
    }


def render_text(findings: list[Finding], width: int = 150) -> str:
    """A four-column table: status, check, message, key to change (message and key wrapped)."""
    w_status = max(len("STATUS"), *(len(f.status) for f in findings))
    w_check = max(len("CHECK"), *(len(f.check) for f in findings))
    w_key = 44
    w_msg = max(40, width - w_status - w_check - w_key - 6)
    lines = [
        f"{'STATUS':<{w_status}}  {'CHECK':<{w_check}}  {'MESSAGE':<{w_msg}}  KEY TO CHANGE",
        f"{'-' * w_status}  {'-' * w_check}  {'-' * w_msg}  {'-' * w_key}",
    ]
    for f in findings:
        msg = textwrap.wrap(f.message, w_msg) or [""]
        key = textwrap.wrap(f.key, w_key, break_on_hyphens=False, break_long_words=False) or [""]
        for i in range(max(len(msg), len(key))):
            first = i == 0
            lines.append(
                f"{f.status if first else '':<{w_status}}  {f.check if first else '':<{w_check}}  "
                f"{msg[i] if i < len(msg) else '':<{w_msg}}  {key[i] if i < len(key) else ''}".rstrip()
            )
    s = summary(findings)
    c = s["counts"]
    tail = f"{c[OK]} ok, {c[WARN]} warn, {c[NOT_CHECKED]} not-checked-here, {c[FAIL]} fail"
    lines.append("")
    lines.append(f"preflight: PASS ({tail})" if s["passed"] else f"preflight: FAIL ({tail}): {', '.join(s['failed'])}")
    return "\n".join(lines)


# ---- command line --------------------------------------------------------------------------------


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def path_environment(settings: ClusterSettings, root: Path) -> dict[str, str]:
    """MODEL_PATH, DATA_DIR, DIST_CKPT_PATH, CKPT_DIR as the profiles read them (only when given; absolute,
    except CKPT_DIR, which is passed as written so that a relative checkpoint folder is refused by name).

    SettingsError for a value the config would read as an interpolation (`settings.config_path_value`)."""
    out = {}
    for name in PATH_SETTINGS:
        value = config_path_value(settings, name)
        if value and settings.where(name) != "default":
            p = Path(value).expanduser()
            out[name] = value if name in AS_WRITTEN_PATH_SETTINGS else str(p if p.is_absolute() else (root / p))
    return out


def compose(config_name: str, overrides: list[str], settings: ClusterSettings, root: Path) -> DictConfig:
    """The resolved config the job runs; ConfigCompositionError (one line) for an override that does not
    compose or gives a non-integer where the config has an integer, SettingsError for a path setting."""

    with _environment(path_environment(settings, root)):
        composed = compose_config(config_name, overrides)
        check_integer_overrides(config_name, overrides, composed)
        return resolved(composed)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.launch.preflight",
        description="Check a job before it starts: sources, patches, layout arithmetic, data, model config, "
        "checkpoint, cluster node and per-die memory. Remaining arguments are Hydra overrides.",
        epilog="exit status: 0 no check failed; 1 a check failed; 2 bad usage or a config that does not compose. "
        "On a host without NPUs the cluster-only checks are listed as not-checked-here.",
    )
    p.add_argument(
        "--profile",
        choices=sorted(set(PROFILES) | {k.replace("_", "-") for k in PROFILES}),
        metavar="{" + ",".join(PROFILES) + "}",
        help="sets the config name and the profile (dashes or underscores)",
    )
    p.add_argument(
        "--config-name",
        default=None,
        choices=CONFIG_NAMES,
        help="trainer config (default ppo_mindspeed_trainer, or the profile's)",
    )
    p.add_argument("--env-file", type=Path, help="cluster settings file (KEY=VALUE lines)")
    for flag, name in (
        ("--master-addr", "MASTER_ADDR"),
        ("--master-port", "MASTER_PORT"),
        ("--nnodes", "NNODES"),
        ("--npus-per-node", "NPUS_PER_NODE"),
        ("--socket-ifname", "SOCKET_IFNAME"),
        ("--dist-ckpt-path", "DIST_CKPT_PATH"),
        ("--model-path", "MODEL_PATH"),
        ("--data-dir", "DATA_DIR"),
        ("--ckpt-dir", "CKPT_DIR"),
    ):
        p.add_argument(flag, dest=name, metavar=name, help=next(x.help for x in SETTINGS if x.name == name))
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other cluster setting (repeatable), e.g. --setting HCCL_IF_BASE_PORT=61000",
    )
    p.add_argument(
        ALLOW_REMOTE_DASHBOARD_FLAG,
        dest="allow_remote_dashboard",
        action="store_true",
        help="accept a RAY_DASHBOARD_HOST other than loopback, as the launch does with this flag",
    )
    p.add_argument(
        "--die-memory-gib",
        type=float_arg(above=0, below=1 << 20),
        help=f"HBM per die (default {ATLAS_A3_DIE.hbm_bytes // GIB}: Atlas A3)",
    )
    p.add_argument("--root", type=Path, default=REPO_ROOT, help="repo root (default: this checkout)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p.parse_known_args(argv)


def main(argv: list[str] | None = None, host: HostFacts | None = None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        print(f"preflight: unknown option(s) {' '.join(bad)} (see --help)", file=sys.stderr)
        return EXIT_USAGE
    if not args.profile and not args.config_name:
        # No default: the A3 profiles differ in what they need (DIST_CKPT_PATH, the smoke run's model), and the
        # bare config is verl's gsm8k example, whose failures would say nothing about the run meant.
        print(f"preflight: {NO_PROFILE}", file=sys.stderr)
        return EXIT_USAGE
    config_name = args.config_name or "ppo_mindspeed_trainer"
    if args.profile:
        profile = PROFILES[args.profile.replace("-", "_")]
        config_name = args.config_name or profile.config_name
        overrides = [*profile.overrides, *overrides]
    flags = {
        n: getattr(args, n)
        for n in (
            "MASTER_ADDR",
            "MASTER_PORT",
            "NNODES",
            "NPUS_PER_NODE",
            "SOCKET_IFNAME",
            "DIST_CKPT_PATH",
            "MODEL_PATH",
            "DATA_DIR",
            "CKPT_DIR",
        )
    }
    for item in args.setting:
        name, sep, value = item.partition("=")
        if not sep or name not in SETTING_NAMES:
            print(
                f"preflight: --setting {item!r}: expected NAME=VALUE with NAME one of {', '.join(SETTING_NAMES)}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        flags[name] = value if flags.get(name) is None else flags[name]

    try:
        settings = load_settings(flags, args.env_file)
        cfg = compose(config_name, overrides, settings, args.root.resolve())
    except (SettingsError, ConfigCompositionError, EnvError) as e:
        print(f"preflight: {e}", file=sys.stderr)
        return EXIT_USAGE
    die = (
        None
        if args.die_memory_gib is None
        else DieSpec(ATLAS_A3_DIE.name, int(args.die_memory_gib * GIB), "given with --die-memory-gib")
    )
    try:
        return report(
            cfg,
            config_name,
            overrides,
            settings,
            args.root.resolve(),
            as_json=args.json,
            host=host,
            die=die,
            allow_remote_dashboard=args.allow_remote_dashboard,
        )
    except EnvError as e:  # a variable the checks themselves cannot run with (VERL_PATCHES_DEVICE=NPU): one line
        print(f"preflight: {e}", file=sys.stderr)
        return EXIT_USAGE


def report(
    cfg: DictConfig,
    config_name: str,
    overrides: list[str],
    settings: ClusterSettings,
    root: Path,
    as_json: bool = False,
    host: HostFacts | None = None,
    die: DieSpec | None = None,
    allow_remote_dashboard: bool = False,
) -> int:
    """Run every check on a composed, resolved config, print the report, return the exit status."""
    die = die or ATLAS_A3_DIE
    if host is None:
        host = probe_host()
    findings = run_preflight(cfg, settings, root, host, die, allow_remote_dashboard)
    status = exit_status(findings)
    tables = rank_tables(cfg, settings, root, host)

    if as_json:
        print(
            json.dumps(
                {
                    "config_name": config_name,
                    "overrides": overrides,
                    "host": host.device,
                    "die": {"name": die.name, "hbm_gib": die.hbm_bytes / GIB, "source": die.source},
                    "findings": [f.as_dict() for f in findings],
                    "summary": summary(findings),
                    "exit_status": status,
                    "rank_layout": rank_layout_json(tables),
                },
                indent=2,
            )
        )
    else:
        print(f"preflight of {' '.join([config_name, *overrides])} on this {host.device} host\n")
        print(render_text(findings))
        print("\n" + rank_layout_text(tables))
    return status


def rank_tables(cfg: DictConfig, settings: ClusterSettings, root: Path, host: HostFacts) -> dict[str, Any]:
    """The per-rank training and rollout layout of the checked config (verl_patches.launch.preflight.rank_table)."""

    _, model = model_findings(Context(cfg=cfg, settings=settings, root=Path(root), host=host))
    return rank_tables_for_config(cfg, model)


if __name__ == "__main__":
    sys.exit(main())
