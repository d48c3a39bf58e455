"""D1 execution: bring up MindSpeed-LLM + MindSpeed + Megatron for the actor/reference in this process.

1. Capture the real torch.compile; render the arguments as argv and import MindSpeed-LLM's arguments
   module under that argv (this runs MindSpeed-LLM's and MindSpeed's megatron adaptors, which read the
   feature flags from sys.argv); restore sys.argv and the real torch.compile.
2. Parse, validate and set Megatron's global args (no tokenizer: verl has its own).
3. Reuse the process's torch.distributed group (verl's worker made it; gloo on a CPU host) or create
   one from the environment, then initialise parallel state with order tp-cp-ep-dp-pp and seed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from verl_patches.base import env_registry
from verl_patches.compile_toggle import capture_real_compile, restore_real_compile
from verl_patches.device import dist_backend
from verl_patches.train_engine.argv import parse_args_from_config
from verl_patches.train_engine.megatron_config import MegatronConfig

ADAPTOR_MODULE = "mindspeed_llm.tasks.megatron_adaptor"
PARALLEL_ORDER = "tp-cp-ep-dp-pp"
_ADAPTOR_ARGV: list[str] | None = None  # the argv the adaptor ran with in this process (set by us)


class TrainEngineInitError(RuntimeError):
    """MindSpeed / Megatron could not be brought up as configured; the message says why."""


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


def apply_mindspeed_adaptor(argv: list[str]) -> None:
    """Import MindSpeed-LLM (its adaptor patches Megatron by the flags in argv) exactly once per process.

    The adaptor reads sys.argv at import: under a Ray worker that is Ray's own command line, so it must
    never be imported before this runs (a second call with other flags cannot change what it patched).
    """
    global _ADAPTOR_ARGV

    if _ADAPTOR_ARGV is not None:
        # The adaptor patched Megatron by the feature switches (bare flags); values such as the micro-batch
        # may differ between actor and reference, the switches may not.
        differing = sorted(_switches(_ADAPTOR_ARGV) ^ _switches(argv))
        if differing:
            raise TrainEngineInitError(
                "MindSpeed's adaptor already ran in this process with other feature switches; it patches Megatron "
                f"once per process, so the actor and reference must share them: {differing}"
            )
        return
    if ADAPTOR_MODULE in sys.modules:
        raise TrainEngineInitError(
            f"{ADAPTOR_MODULE} was imported before initialize_megatron: it configured MindSpeed from this process's "
            "own command line instead of the job's config; import mindspeed_llm only through initialize_megatron"
        )
    capture_real_compile()
    try:
        with _argv(argv):
            import mindspeed_llm.training.arguments  # noqa: F401  (runs the adaptors under our argv)
    finally:
        restore_real_compile()
    _ADAPTOR_ARGV = list(argv)


def _switches(argv: list[str]) -> set[str]:
    return {a for a in argv[1:] if a.startswith("--") and "=" not in a}


def _ensure_process_group(backend: str, timeout_minutes: int) -> None:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch.distributed as dist

    if dist.is_initialized():
        return
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if k not in os.environ]
    if missing:
        raise TrainEngineInitError(f"no torch.distributed group and {missing} unset: cannot create one")
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=timeout_minutes))


def initialize_megatron(config: MegatronConfig | Mapping[str, Any], prog: str = "verl_patches-train-engine") -> Any:
    """Bring up MindSpeed-LLM/Megatron in this process for `config` (see translate.py); returns Megatron's args.

    Idempotent for the same config: parallel state that is already initialised is kept.
    """

    cfg = config if isinstance(config, MegatronConfig) else MegatronConfig(config)
    # Megatron refuses overlapped gradient reduction without it; the A3 job environment sets it too.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    argv = [prog] + parse_args_from_config(cfg)
    apply_mindspeed_adaptor(argv)

    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch.distributed as dist

    # deferred: importing this module must not load Megatron; it loads once the prelude patched it
    from megatron.core import parallel_state as mpu
    from megatron.training import arguments as megatron_arguments
    from megatron.training.global_vars import set_global_variables
    from megatron.training.initialize import _set_random_seed

    # deferred: importing this module must not load MindSpeed-LLM; it loads once the prelude patched it
    from mindspeed_llm.training.arguments import parse_args_decorator

    timeout_minutes = 10
    _ensure_process_group(dist_backend(), timeout_minutes)
    with _argv(argv):
        args = parse_args_decorator(megatron_arguments.parse_args)(None, False)
    args.rank, args.world_size = dist.get_rank(), dist.get_world_size()
    args.local_rank = env_registry.integer("LOCAL_RANK")
    megatron_arguments.validate_args(args, {})
    _reset_global_args()
    set_global_variables(args, build_tokenizer=False)

    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(
            args.tensor_model_parallel_size,
            args.pipeline_model_parallel_size,
            args.virtual_pipeline_model_parallel_size,
            args.pipeline_model_parallel_split_rank,
            context_parallel_size=args.context_parallel_size,
            expert_model_parallel_size=args.expert_model_parallel_size,
            distributed_timeout_minutes=timeout_minutes,
            order=PARALLEL_ORDER,
        )
    _set_random_seed(args.seed, args.data_parallel_random_init)
    return args


def _reset_global_args() -> None:
    """set_global_variables asserts nothing is set yet; a second bring-up (the reference after the actor,
    a test after a test) replaces the previous values."""
    # deferred: importing this module must not load Megatron; it loads once the prelude patched it
    from megatron.training import global_vars

    for name in (
        "_GLOBAL_ARGS",
        "_GLOBAL_TIMERS",
        "_GLOBAL_SIGNAL_HANDLER",
        "_GLOBAL_NUM_MICROBATCHES_CALCULATOR",
        "_GLOBAL_TOKENIZER",
        "_GLOBAL_TENSORBOARD_WRITER",
        "_GLOBAL_WANDB_WRITER",
        "_GLOBAL_ONE_LOGGER",
        "_GLOBAL_ADLR_AUTORESUME",
    ):
        if hasattr(global_vars, name):
            setattr(global_vars, name, None)
    try:
        # deferred: importing this module must not load Megatron; it loads once the prelude patched it
        from megatron.core import num_microbatches_calculator as nmc

        nmc._GLOBAL_NUM_MICROBATCHES_CALCULATOR = None
    except ImportError:
        pass
