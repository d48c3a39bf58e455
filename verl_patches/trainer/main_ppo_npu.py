"""Trainer entry: `python -m verl_patches.trainer.main_ppo_npu [--config-name NAME] [key=value ...]`.

Imports the prelude (our patches), composes our config on top of verl's own, checks it, runs the caller's
`prepare` on it (the CPU proof's entry, `verl_patches.cpu_proof.main_tiny`, builds the tiny profile's local
assets there: this entry refuses that profile without it), saves the resolved config in the run folder
(`resolved_config`), then runs verl v0.4.0's own `run_ppo` with the worker classes for the configured strategy.
Nothing is copied into the vendored verl tree.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import OmegaConf

from verl_patches.base.overlay_settings import overlay_settings
from verl_patches.driver.config_checks import OverlayConfigError, raise_on_problems
from verl_patches.driver.rank_memory import run_dir
from verl_patches.sources.pins import check as check_package_versions
from verl_patches.trainer.checkpoint_folder import folder_problem, root_problem
from verl_patches.trainer.config_compose import CONFIG_NAMES, ConfigCompositionError, compose_config, resolved
from verl_patches.trainer.entries import CPU_PROOF_ENTRY
from verl_patches.trainer.resolved_config import save_resolved_config
from verl_patches.worker_calls.env_names import DIES_PER_CARD_ENV


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.trainer.main_ppo_npu",
        description="GRPO with verl v0.4.0 plus the NPU overlay. Remaining arguments "
        "are Hydra overrides (key=value, profile=NAME).",
    )
    p.add_argument("--config-name", default="ppo_mindspeed_trainer", choices=CONFIG_NAMES)
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return p.parse_known_args(argv)


def main(argv: list[str] | None = None, prepare: Callable[[Any], object] | None = None) -> int:
    """The trainer entry; `prepare(cfg)` (the CPU proof's caller) builds what the resolved config reads before the
    run starts, a ValueError naming what is wrong."""
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        print(f"main_ppo_npu: unknown option(s) {bad}", file=sys.stderr)
        return 2

    import verl_patches.prelude_patch  # noqa: F401  (activates our patches in the driver)

    try:
        cfg = resolved(compose_config(args.config_name, overrides))
        raise_on_problems(cfg)
    except (ConfigCompositionError, OverlayConfigError) as e:
        print(f"main_ppo_npu: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(OmegaConf.to_yaml(cfg))
        return 0

    # the resume reads the folder first thing: refused here in one line, not as a worker's traceback
    folder = folder_problem(cfg) or root_problem(cfg)
    if folder:
        print(f"main_ppo_npu: {folder}", file=sys.stderr)
        return 2

    # before step 1, so a user on another image sees which versions this run does not share with A3's pins
    print(f"main_ppo_npu: {check_package_versions()[0]}", flush=True)

    overlay = overlay_settings(cfg)  # typed and checked by the composition (`config_compose.resolved`)
    os.environ[DIES_PER_CARD_ENV] = str(overlay.dies_per_card)
    if overlay.profile == "tiny" and prepare is None:
        print(
            f"main_ppo_npu: the tiny profile's assets are built by the CPU proof's entry: python -m {CPU_PROOF_ENTRY} "
            "(the launcher's --tiny starts it)",
            file=sys.stderr,
        )
        return 2
    if prepare is not None:
        try:
            prepare(cfg)
        except ValueError as e:
            print(f"main_ppo_npu: {e}", file=sys.stderr)
            return 2

    try:  # what this run runs, in its run folder, before any worker starts
        saved = save_resolved_config(cfg, args.config_name, overrides, run_dir())
    except OSError as e:
        print(f"main_ppo_npu: cannot save the resolved config: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    if saved is not None:
        print(f"main_ppo_npu: resolved config: {saved}", flush=True)

    from verl.trainer.main_ppo import run_ppo  # wrapped by our patch: Ray starts with our runtime env

    run_ppo(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
