"""Command line of setup_sources.sh: populate, verify, audit, export a cache, relock."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from verl_patches.base.host_device import DeviceSettingError, detect_host_device
from verl_patches.sources import dist_info, names
from verl_patches.sources.errors import SourceError
from verl_patches.sources.install import SetupOptions, export_cache, git_urls, relock, setup
from verl_patches.sources.lock import ROUTES, Lock, LockError, load_lock
from verl_patches.sources.paths import user_cache_dir
from verl_patches.sources.report import exit_status, render_verify, sources_report

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3

EPILOG = """\
exit status: 0 complete; 3 complete except components this host does not need (for example MindSpeed on a
CPU machine that cannot reach git); 1 something this host needs is missing or differs from the lock;
2 bad usage.
environment: VERL_OVERLAY_CACHE (download cache, default ~/.cache/verl_overlay),
VERL_OVERLAY_SOURCES_CACHE (an exported cache directory, used as --cache DIR when that option is absent),
VERL_OVERLAY_GIT_MIRROR_<NAME>=url1,url2 (mirrors tried first, e.g. VERL_OVERLAY_GIT_MIRROR_MINDSPEED),
PIP_INDEX_URL (PyPI mirror), VERL_PATCHES_DEVICE=npu|cuda|cpu (override host detection).
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="setup_sources.sh",
        description="Populate verl/ vllm/ vllm_ascend/ megatron/ mindspeed/ mindspeed_llm/ exactly as "
        "sources.lock pins them, and insert the one prelude line into verl.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--route",
        choices=("auto",) + ROUTES,
        default="auto",
        help="where sources come from; auto tries cache, git, then PyPI (default)",
    )
    env_cache = os.environ.get("VERL_OVERLAY_SOURCES_CACHE") or None
    p.add_argument(
        "--cache",
        metavar="DIR",
        type=Path,
        default=Path(env_cache) if env_cache else None,
        help="directory made by --export-cache (offline install); default: $VERL_OVERLAY_SOURCES_CACHE",
    )
    p.add_argument(
        "--export-cache",
        metavar="DIR",
        type=Path,
        help="write every component's artifact into DIR for an air-gapped cluster, then stop",
    )
    p.add_argument(
        "--mirror",
        metavar="NAME=URL",
        action="append",
        default=[],
        help="git URL tried first for component NAME (repeatable), e.g. mindspeed=https://gitee.com/ascend/MindSpeed.git",
    )
    p.add_argument("--index-url", metavar="URL", help="PyPI simple index (default: pip's own setting)")
    p.add_argument("--only", metavar="NAME", nargs="+", help="components to act on (default: all)")
    p.add_argument("--verify", action="store_true", help="no network: check every folder and the prelude line")
    p.add_argument("--audit", action="store_true", help="print the audit report (same as python -m verl_patches.audit)")
    p.add_argument("--json", action="store_true", help="with --verify/--audit: machine-readable output")
    p.add_argument(
        "--force", action="store_true", help="replace folders that differ from the lock (local edits are lost)"
    )
    p.add_argument("--relock", action="store_true", help="recompute the lock's tree hashes after a pin edit")
    p.add_argument("--offline", action="store_true", help="use only the download cache and --cache DIR")
    p.add_argument("--lock", type=Path, help="lock file (default: sources.lock beside this script)")
    p.add_argument("--root", type=Path, help="where the package folders live (default: the lock's folder)")
    return p.parse_args(argv)


def _mirrors(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise SourceError(f"--mirror expects NAME=URL, got {item!r}")
        try:
            names.git_url(url)
        except ValueError as e:
            raise SourceError(f"--mirror {name}=: {e}") from None
        out.setdefault(name, []).append(url)
    return out


def _print_outcomes(outcomes: list) -> None:
    for o in outcomes:
        opt = " (optional on this host)" if o.optional_here and o.status in ("missing", "failed") else ""
        print(f"{o.component:<14} {o.status + opt:<36} route={o.route or '-'}  {o.detail}")
        for a in o.attempts if o.status in ("missing", "failed") else []:
            print(f"    tried {a}")


def lock_root_device(args: argparse.Namespace) -> tuple[Lock, Path, str]:
    """The lock (narrowed to ``--only``), the folder the packages live in, and this host's device. Raises
    LockError or DeviceSettingError, each naming the file or setting at fault."""
    lock = load_lock(args.lock or Path(__file__).resolve().parents[2] / "sources.lock")
    if args.only:
        lock.select(args.only)
    root = (args.root or lock.path.parent).resolve()
    return lock, root, detect_host_device()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        lock, root, device = lock_root_device(args)
    except (LockError, DeviceSettingError) as e:
        print(f"setup_sources.sh: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.audit:
        # setup_sources.sh hands --audit to verl_patches.audit (a layer above this package), never here
        print("setup_sources.sh: --audit is the audit's report: run `bash setup_sources.sh --audit`", file=sys.stderr)
        return EXIT_USAGE

    if args.verify:
        report = sources_report(root, lock, device, args.only, with_diff=False)
        report["distributions"] = dist_info.report(root, lock, args.only)  # generated .dist-info folders
        print(
            json.dumps(report, indent=2)
            if args.json
            else render_verify(report["components"]) + "\n" + dist_info.render(report["distributions"])
        )
        return exit_status(report["components"]) or dist_info.exit_status(report["distributions"])

    routes = ["cache", "git", "pypi"] if args.route == "auto" else [args.route]
    if args.route == "auto" and args.cache is None:
        routes.remove("cache")
    try:
        opts = SetupOptions(
            root=root,
            lock=lock,
            cache=user_cache_dir(),
            routes=routes,
            cache_dir=args.cache,
            index_url=args.index_url,
            mirrors=_mirrors(args.mirror),
            offline=args.offline,
            force=args.force,
            device=device,
        )
        unknown = sorted(set(opts.mirrors) - set(lock.components))
        if unknown:
            raise SourceError(f"--mirror {unknown[0]}=...: no component {unknown[0]!r} in {lock.path.name}")
        for comp in lock.select(args.only):  # every mirror is checked before anything runs
            git_urls(opts, comp)
    except SourceError as e:
        print(f"setup_sources.sh: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.export_cache:
            outcomes = export_cache(opts, args.export_cache, args.only)
            _print_outcomes(outcomes)
            missing = [o for o in outcomes if o.status != "exported"]
            print(
                f"exported {len(outcomes) - len(missing)} component(s) to {args.export_cache}"
                + (f"; not exported: {', '.join(o.component for o in missing)}" if missing else "")
            )
            return EXIT_FAIL if missing else EXIT_OK
        if args.relock:
            outcomes = relock(opts, args.only)
            _print_outcomes(outcomes)
            return EXIT_FAIL if any(o.status != "relocked" for o in outcomes) else EXIT_OK
        outcomes = setup(opts, args.only)
    except SourceError as e:
        print(f"setup_sources.sh: {e}", file=sys.stderr)
        return EXIT_FAIL
    _print_outcomes(outcomes)
    for d in dist_info.generate(root, lock, args.only):  # vllm / vllm_ascend metadata and entry points
        print(f"{d.component + ' metadata':<14} {d.status:<36} {d.detail}")
    report = sources_report(root, lock, device, args.only, with_diff=False)
    status = exit_status(report["components"]) or dist_info.exit_status(dist_info.report(root, lock, args.only))
    if status:
        print(render_verify([c for c in report["components"] if c["status"] != "match"]))
    optional_missing = [c["name"] for c in report["components"] if c["status"] == "missing" and c["optional_here"]]
    if status == EXIT_OK:
        print("setup: COMPLETE — every component matches sources.lock")
    elif status == EXIT_PARTIAL:
        print(
            f"setup: COMPLETE EXCEPT OPTIONAL-HERE — {', '.join(optional_missing)} not installed; this "
            f"{device} host does not need them (the A3 job does: run setup again where git or --cache DIR "
            f"can supply them)"
        )
    else:
        print("setup: INCOMPLETE — see the lines above")
    return status


if __name__ == "__main__":
    sys.exit(main())
