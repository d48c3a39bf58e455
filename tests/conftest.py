"""Suite-wide hooks. `@pytest.mark.needs_components(...)`: see tests/suite_components.py."""

from __future__ import annotations

import os

import pytest

from suite_components import require_components
from tier_report import TierReport
from verl_patches.base import cpu_numerics


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # a pytest-xdist worker reports to the controller, which keeps the tier
        config.pluginmanager.register(TierReport(config), "verl_patches_tier_report")
    # Every process that imports Megatron (a test's ranks, Ray workers, check tools) would otherwise pre-start
    # torch Inductor's compile pool (a process importing torch, and two forks) that nothing in the suite uses;
    # the tiny run's launcher says the same (verl_patches.launch.job.no_compile_pool). Inductor still starts
    # the pool on first use.
    os.environ.setdefault("TORCH_WARM_POOL", "0")
    # One intra-op thread per process, as the tiny run pins it (verl_patches.base.cpu_numerics): the suite runs
    # two test processes and its multi-rank tests start several more, which at torch's default (one thread per
    # core) oversubscribe a small host (measured on 2 cores: the heaviest multi-process tests 12 % faster).
    # Read by torch when it starts its thread pool, after this hook (test modules import torch at collection).
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(key, cpu_numerics.PINS[key])


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs_components"):
        require_components(*mark.args)


@pytest.fixture(scope="session")
def vllm_job_process() -> None:
    """This test process set up as every process of the job is before it imports vLLM's model modules: the
    prelude active (it puts the generated vllm/vllm_ascend metadata on the path), so vllm-ascend's general
    plugin (its torch 2.5.1 custom-op fix) is loaded at `import vllm`."""
    import verl_patches.prelude_patch  # noqa: F401

    # isort: split
    import vllm  # noqa: F401  (the declared patch vllm.general_plugins_at_import runs here)
    import vllm.utils

    registrar = vllm.utils.direct_register_custom_op.__module__
    assert registrar.startswith("vllm_ascend."), (
        f"vLLM's custom-op registration is still {registrar}: vllm-ascend's general plugin did not load"
    )
