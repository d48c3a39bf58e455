"""Every environment variable the project reads, as data: its name, parser, default, owners, one line of doc and
whose name it is (ours, the vendor recipe's, vLLM's, HCCL's, ...).

One registry serves three readers:

* the code: the getters (`flag`, `integer`, `number`, `text`, `items`, `is_set`) parse a variable with its
  registered kind, bounds and default (`base.env_flags` is the grammar), and refuse a name that is not registered,
  so a variable cannot be read without an entry here (tests/ci/test_env_registry.py finds every read by AST);
* the dry run: `problem` parses a value with the same parser the job uses, so a value the job would die on
  (``VERL_PATCHES_QUIET=2``, ``PRINT_MEMORY=enabled``) is refused before anything starts, and `closest` names the
  registered variable nearest to a misspelt ``VERL_PATCHES_*`` one;
* the reader of the documentation: ``python -m verl_patches.base.env_registry --markdown`` prints the table
  `DOC_PAGE` (docs/environment.md) holds between its markers (``--write-docs docs/environment.md`` puts it there;
  a test keeps the two equal).

A family entry (its name ends in ``*``) covers every variable with that prefix (``VERL_OVERLAY_GIT_MIRROR_*``).
Standard library only: the sources' setup reads these before anything is installed.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from verl_patches.base.env_flags import EnvError, env_flag, env_float, env_int, env_list, env_str

FLAG, INT, FLOAT, TEXT, LIST, CHOICE, RETIRED = "switch", "integer", "number", "text", "list", "choice", "retired"
KINDS = (FLAG, INT, FLOAT, TEXT, LIST, CHOICE, RETIRED)

# whose name it is: who defined the variable (not who reads it here)
OURS = "ours"
VENDOR = "vendor recipe"
VLLM = "vLLM / vllm-ascend"
HCCL = "HCCL / CANN / torch_npu"
TORCH = "torch / BLAS"
RAY = "Ray"
VERL = "verl"
SYSTEM = "system"
WHOSE = (OURS, VENDOR, VLLM, HCCL, TORCH, RAY, VERL, SYSTEM)

FAMILY_MARK = "*"
OUR_PREFIXES = ("VERL_PATCHES_", "VERL_OVERLAY_", "VERL_LAUNCH_")
# the documentation page whose table of environment variables is generated from this registry
DOC_PAGE = "docs/environment.md"
TABLE_BEGIN = (
    f"<!-- env-registry:begin (generated: python -m verl_patches.base.env_registry --write-docs {DOC_PAGE}) -->"
)
TABLE_END = "<!-- env-registry:end -->"


class UnregisteredVariable(LookupError):
    """Code asked for a variable that is not in `REGISTRY`, or with a getter of another kind; one line."""


@dataclass(frozen=True)
class Variable:
    """One environment variable: how it is parsed, its default when unset (None: no default, the reader decides),
    who reads it (repo paths) and what it does."""

    name: str
    kind: str
    default: object
    owners: tuple[str, ...]
    doc: str
    whose: str = OURS
    minimum: float | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    replaced_by: str = ""  # RETIRED: the name to use
    judged_by: str = ""  # a preflight check that judges this variable itself (the generic parse leaves it alone)

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.whose not in WHOSE or not self.owners or not self.doc:
            raise ValueError(f"{self.name}: bad registry entry")

    @property
    def family(self) -> bool:
        return self.name.endswith(FAMILY_MARK)

    def covers(self, name: str) -> bool:
        return name.startswith(self.name[:-1]) if self.family else name == self.name

    def parse(self, raw: str | None, name: str | None = None, default: object = None) -> object:
        """``raw`` (None: unset) as the job reads it: `EnvError` naming the variable, the value and what is
        accepted. ``default`` (when not None) replaces the registered default for an unset variable."""
        name = name or self.name
        fallback = self.default if default is None else default
        env = {} if raw is None else {name: raw}
        if self.kind == FLAG:
            return env_flag(name, default=bool(fallback), environ=env)
        if self.kind == INT:
            number = env_int(name, -1, environ=env, minimum=_int_or_none(self.minimum), maximum=self.maximum)
            if raw is None or not raw.strip():
                return _required(name, fallback)
            return number
        if self.kind == FLOAT:
            if raw is None or not raw.strip():
                return _required(name, fallback)
            return env_float(name, 0.0, minimum=self.minimum, environ=env)
        if self.kind == LIST:
            return env_list(name, environ=env)
        value = env_str(name, environ=env)
        if self.kind == RETIRED and value:
            raise EnvError(f"{name}={raw!r}: this variable is no longer read; set {self.replaced_by}={value} instead")
        if self.kind == CHOICE and value and value not in self.choices:
            raise EnvError(f"{name}={raw!r}: expected {', '.join(self.choices[:-1])} or {self.choices[-1]}")
        return value or ("" if fallback is None else fallback)

    def accepted(self) -> str:
        """What a value may be, for the documentation's table and the refusals."""
        if self.kind == FLAG:
            return "switch"
        if self.kind in (INT, FLOAT):
            low = "" if self.minimum is None else f"≥ {_number(self.minimum)}"
            high = "" if self.maximum is None else f"≤ {self.maximum}"
            bounds = ", ".join(b for b in (low, high) if b)
            return self.kind + (f" ({bounds})" if bounds else "")
        if self.kind == CHOICE:
            return " \\| ".join(self.choices)
        if self.kind == RETIRED:
            return f"refused: use {self.replaced_by}"
        return "comma-separated list" if self.kind == LIST else "text"

    def shown_default(self) -> str:
        if self.kind == FLAG:
            return "on" if self.default else "off"
        if self.default is None or self.default == "" or self.default == []:
            return "unset"
        return _number(self.default) if isinstance(self.default, (int, float)) else str(self.default)


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _required(name: str, fallback: object) -> object:
    if fallback is None:
        raise EnvError(f"{name} is not set")
    return fallback


def _v(
    name: str,
    kind: str,
    default: object,
    owners: str,
    doc: str,
    whose: str = OURS,
    *,
    minimum: float | None = None,
    maximum: int | None = None,
    choices: tuple[str, ...] = (),
    replaced_by: str = "",
    judged_by: str = "",
) -> Variable:
    """An entry; ``owners`` are space-separated repo paths."""
    return Variable(
        name, kind, default, tuple(owners.split()), doc, whose, minimum, maximum, choices, replaced_by, judged_by
    )


P = "verl_patches/"
_VARIABLES: tuple[Variable, ...] = (
    # ---- ours: the patches and their machinery ----
    _v(
        "VERL_PATCHES_QUIET", FLAG, False, P + "patching/registry.py", "no per-process line listing the patches applied"
    ),
    _v(
        "VERL_PATCHES_ALLOW_DRIFT",
        LIST,
        [],
        P + "patching/registry.py",
        "patch names (or `all`) applied although their upstream target's fingerprint changed",
    ),
    _v(
        "VERL_PATCHES_FINGERPRINT_CACHE",
        TEXT,
        "",
        P + "patching/fingerprint.py",
        "folder of the fingerprint cache (default ~/.cache/verl_patches/fingerprints), or `off`",
    ),
    _v(
        "VERL_PATCHES_ACTIVATION_DIR",
        TEXT,
        "",
        P + "patching/activation_record.py " + P + "launch/job.py",
        "folder where each patched process records what it applied (the launcher sets it)",
    ),
    _v(
        "VERL_PATCHES_ROLLOUT_STANDIN",
        FLAG,
        False,
        P + "patches/verl/workers/rollout/declarations.py",
        "bind the rollout test double instead of vLLM (tests only)",
    ),
    _v(
        "VERL_PATCHES_KV_NZ",
        FLAG,
        False,
        P + "rollout/kv_nz_switch.py",
        "install F4 (vllm-ascend's KV cache in NZ layout); the launcher sets it from the config's `enable_kv_nz`",
    ),
    _v(
        "VERL_PATCHES_CPU_PROOF_FP32",
        FLAG,
        False,
        P + "npu_emulation/wheel_contract/cpu_proof.py",
        "the CPU proof's fp32 run: emulated kernels accept float32 (set by the fp32 patch)",
    ),
    _v(
        "VERL_PATCHES_CPU_PROOF_SCALED_MODEL",
        FLAG,
        False,
        P + "npu_emulation/wheel_contract/cpu_proof.py",
        "the CPU proof's scaled-down model: the kernels' MLA size limits are not enforced",
    ),
    _v(
        "VERL_PATCHES_NPU_MEMORY_GIB",
        FLOAT,
        0.0,
        P + "npu_emulation/site/torch_npu/npu/memory.py",
        "memory the emulated NPU reports, in GiB (0: the host's)",
        minimum=0.0,
    ),
    _v(
        "VERL_PATCHES_DEVICE",
        CHOICE,
        "",
        P + "base/host_device.py",
        "the host's device, overriding detection everywhere (setup, emulation, trainer)",
        choices=("npu", "cuda", "cpu"),
    ),
    _v(
        "VERL_OVERLAY_DEVICE",
        RETIRED,
        "",
        P + "base/host_device.py",
        "the former name of the device override",
        replaced_by="VERL_PATCHES_DEVICE",
    ),
    # ---- ours: the job ----
    _v(
        "VERL_PATCHES_COLLECTIVE_TIMEOUT_S",
        FLOAT,
        0.0,
        P + "resilience/timeout.py " + P + "launch/job_env.py",
        "seconds without progress before the driver names the hung rank (0: no watchdog; the launcher sets 90% of "
        "HCCL_EXEC_TIMEOUT)",
        minimum=0.0,
    ),
    _v(
        "VERL_PATCHES_INJECT_STOP",
        TEXT,
        "",
        P + "resilience/fault_injection.py",
        "`<rank>:<phase>:<step>`: that rank stops itself there (the hang tests); once per run folder",
    ),
    _v(
        "VERL_PATCHES_INJECT_KILL",
        TEXT,
        "",
        P + "resilience/fault_injection.py",
        "`<rank>:<phase>:<step>`: that rank kills itself there (SIGKILL; the restart tests); once per run folder",
    ),
    _v(
        "VERL_PATCHES_DIES_PER_CARD",
        INT,
        1,
        P + "patches/verl/trainer/metrics.py",
        "dies per card for the per-card throughput (the trainer entry sets it from `overlay.dies_per_card`)",
        minimum=1,
    ),
    _v(
        "VERL_PATCHES_RUN_DIR",
        TEXT,
        "",
        P + "driver/rank_memory.py " + P + "resilience/fault_injection.py",
        "the run's log folder (the launcher sets it, tiny and cluster alike): where the trainer writes "
        "resolved_config.yaml, curves.png and rank_memory.jsonl (else the parent of TENSORBOARD_DIR), and the fault "
        "injections' once-only markers",
    ),
    _v(
        "VERL_PATCHES_VLLM_DP_BASE_PORT",
        INT,
        None,
        P + "rollout/dp_env.py",
        "vLLM DP master ports are this + 1 onwards, one per DP group (the cluster launch sets it from MASTER_PORT)",
        minimum=1023,
        maximum=65534,
        judged_by="local.dp_ports",
    ),
    _v(
        "VERL_PATCHES_VLLM_ASCEND_KERNELS",
        TEXT,
        "",
        P + "rollout/kernels_path.py",
        "folder of vllm-ascend's compiled kernels (default: site-packages/vllm_ascend_kernels)",
    ),
    _v(
        "VERL_PATCHES_ALLOW_SHARED_CKPT_ROOT",
        FLAG,
        False,
        P + "checkpoint/root_access.py",
        "accept, by name, a checkpoint root others can write into on the cluster",
    ),
    _v(
        "VERL_PATCHES_CHECK_TOKEN",
        TEXT,
        "",
        P + "launch/cluster/collective_report.py " + P + "launch/cluster/collective_check.py",
        "collective_check's per-run token (or give it on stdin with --token-stdin)",
    ),
    _v(
        "VERL_LAUNCH_PROFILE",
        TEXT,
        "",
        P + "launch/job.py " + P + "scripts/launch_job.sh",
        "the profile a train_*.sh script runs (set by launch_job.sh; another --profile is refused)",
    ),
    _v(
        "VERL_LAUNCH_PROG",
        TEXT,
        "",
        P + "launch/job.py " + P + "scripts/launch_job.sh",
        "the program name the launcher's --help shows (set by the scripts)",
    ),
    _v(
        "CHECK_LOGPROBS_TRACEBACK",
        FLAG,
        False,
        P + "checks/cli.py",
        "check_logprobs.py prints the traceback of an unexpected failure",
    ),
    _v(
        "PYTHON",
        TEXT,
        "",
        P + "scripts/launch_job.sh " + P + "scripts/setup_cpu_env.sh setup_sources.sh",
        "the Python the scripts run (else the repo's .venv, else python3)",
    ),
    # ---- ours: the sources' set-up ----
    _v(
        "VERL_OVERLAY_CACHE",
        TEXT,
        "",
        P + "base/user_cache.py setup_sources.sh",
        "the user cache folder (wheels, tools; default ~/.cache/verl_overlay)",
    ),
    _v(
        "VERL_OVERLAY_SOURCES_CACHE",
        TEXT,
        "",
        P + "sources/__main__.py",
        "a folder of upstream source archives exported with --export-cache (offline set-up)",
    ),
    _v(
        "VERL_OVERLAY_GIT_TIMEOUT",
        FLOAT,
        600.0,
        P + "sources/git_route.py",
        "seconds per git command of the set-up",
        minimum=0.0,
    ),
    _v(
        "VERL_OVERLAY_HTTP_TIMEOUT",
        FLOAT,
        60.0,
        P + "sources/pypi_route.py",
        "seconds per HTTP request of the set-up",
        minimum=0.0,
    ),
    # what an upstream archive may unpack (sources/extract.py)
    *(
        _v(name, INT, default, P + "sources/extract.py", f"{what} an upstream archive may {verb}", minimum=0)
        for name, default, what, verb in (
            ("VERL_OVERLAY_MAX_FILE_BYTES", 128 << 20, "largest file", "unpack"),
            ("VERL_OVERLAY_MAX_TREE_BYTES", 1 << 30, "largest total", "unpack"),
            ("VERL_OVERLAY_MAX_MEMBERS", 200_000, "most members", "hold"),
        )
    ),
    _v(
        "VERL_OVERLAY_GIT_MIRROR_*",
        LIST,
        [],
        P + "sources/install.py",
        "git mirrors of component `<NAME>` (upper case), tried before the lock's URLs",
    ),
    # ---- the vendor recipe's names ----
    _v(
        "D2D_DATA_TRANSFER",
        FLAG,
        False,
        P + "driver/step_plan.py",
        "the D2D tensor cache; when set it overrides `overlay.d2d_tensor_cache`",
        VENDOR,
    ),
    _v("PRINT_MEMORY", FLAG, False, P + "tools.py", "workers log device memory at each stage", VENDOR),
    _v("PROFILE_UPDATE", FLAG, False, P + "profiler.py", "profile the actor update (traces in ./profiling)", VENDOR),
    _v(
        "NO_ALL_TO_ALL_RESHARD",
        FLAG,
        False,
        P + "sync/path.py",
        "weight sync by all-gather instead of the all-to-all reshard",
        VENDOR,
    ),
    # read by nothing but the dry run's env.vendor check, which maps or refuses each
    *(
        _v(name, kind, default, P + "launch/preflight/vendor_env.py", doc, VENDOR, judged_by="env.vendor")
        for name, kind, default, doc in (
            (
                "VLLM_ENABLE_GRAPH_MODE",
                FLAG,
                False,
                "the vendor's graph-mode switch: read by nothing here (the config key is); the dry run maps or "
                "refuses it",
            ),
            (
                "VLLM_ENABLE_FIX_ROUTE",
                FLAG,
                False,
                "the vendor's balanced rollout routing, not in vllm-ascend 0.9.1: refused when on",
            ),
            (
                "VLLM_ENABLE_MC2",
                FLAG,
                True,
                "the vendor's MC2 switch: read by nothing (MC2 is vllm-ascend's own choice); refused when off",
            ),
            ("VLLM_ASCEND_ACL_OP_INIT_MODE", TEXT, "", "the vendor's: read by nothing here; the dry run says so"),
            (
                "ROLLOUT_REBALANCE_ENABLE",
                FLAG,
                False,
                "the vendor's rollout rebalance, not carried here: refused when on",
            ),
        )
    ),
    # ---- vLLM / vllm-ascend ----
    _v(
        "VLLM_DP_SIZE",
        INT,
        1,
        P + "rollout/engine_factory.py " + P + "rollout/verl_hooks.py " + P + "sync/megatron_source.py",
        "ranks per vLLM instance's DP group (the launcher sets it)",
        VLLM,
        minimum=1,
        judged_by="env.vendor",
    ),
    _v(
        "VLLM_DP_RANK",
        INT,
        0,
        P + "rollout/engine_factory.py " + P + "rollout/standin/engine.py",
        "this rank's DP rank in its instance (each rank exports its own, F2)",
        VLLM,
        minimum=0,
    ),
    _v(
        "VLLM_DP_MASTER_PORT",
        INT,
        None,
        P + "rollout/verl_hooks.py " + P + "launch/preflight/env.py",
        "vLLM's DP master port; set by hand, no rank exports its own VLLM_DP_* (F2 is off): refused with DP > 1",
        VLLM,
        minimum=1,
        maximum=65535,
        judged_by="env.variables",
    ),
    # ---- HCCL / CANN / torch_npu ----
    _v(
        "HCCL_SOCKET_IFNAME",
        TEXT,
        "",
        P + "rollout/dp_env.py",
        "NIC of HCCL's sockets; its address is the DP master's",
        HCCL,
    ),
    _v("ASCEND_HOME_PATH", TEXT, "", P + "rollout/kernels.py", "the CANN toolkit (set by its set_env.sh)", HCCL),
    _v("ASCEND_TOOLKIT_HOME", TEXT, "", P + "rollout/kernels.py", "the CANN toolkit, older name", HCCL),
    _v(
        "ASCEND_PROCESS_LOG_PATH",
        TEXT,
        "",
        P + "launch/cluster/node_logs.py",
        "CANN's log folder (default ~/ascend/log)",
        HCCL,
    ),
    _v(
        "ASCEND_RT_VISIBLE_DEVICES",
        TEXT,
        "",
        P + "npu_emulation/site/torch_npu/npu/__init__.py",
        "the NPUs this process sees (the emulation honours it as the runtime does)",
        HCCL,
    ),
    _v("PYTORCH_NPU_ALLOC_CONF", TEXT, "", P + "device.py", "torch_npu's allocator settings", HCCL),
    _v(
        "TORCH_HCCL_ENABLE_MONITORING",
        FLAG,
        False,
        P + "resilience/heartbeat.py",
        "torch_npu's HCCL monitor thread (the launcher sets it)",
        HCCL,
    ),
    _v(
        "TORCH_HCCL_DUMP_ON_TIMEOUT",
        FLAG,
        False,
        P + "resilience/heartbeat.py",
        "torch_npu's flight-recorder dump on a time-out (the launcher sets it)",
        HCCL,
    ),
    _v(
        "TORCH_HCCL_DEBUG_INFO_TEMP_FILE",
        TEXT,
        "/tmp/hccl_trace_rank_",
        P + "resilience/heartbeat.py",
        "prefix of torch_npu's flight-recorder dumps",
        HCCL,
    ),
    # ---- torch and the BLAS ----
    _v(
        "RANK",
        INT,
        None,
        P + "tools.py " + P + "rollout/engine_factory.py " + P + "launch/cluster/collective_rank.py",
        "this process's global rank (torch.distributed)",
        TORCH,
        minimum=0,
    ),
    _v(
        "WORLD_SIZE",
        INT,
        None,
        P + "patches/verl/workers/fsdp_workers.py " + P + "launch/cluster/collective_rank.py",
        "the number of ranks (torch.distributed; the cluster launch sets it)",
        TORCH,
        minimum=1,
        judged_by="env.vendor",
    ),
    _v(
        "LOCAL_RANK",
        INT,
        0,
        P + "device.py " + P + "train_engine/initialize.py",
        "this process's rank on its node (torch.distributed)",
        TORCH,
        minimum=0,
    ),
    *(
        _v(
            f"MASTER_{suffix}",
            TEXT,
            "",
            P + "resilience/heartbeat.py " + P + "train_engine/initialize.py",
            f"torch.distributed's rendezvous {part} (also a cluster setting)",
            TORCH,
        )
        for suffix, part in (("ADDR", "address"), ("PORT", "port"))
    ),
    _v("GLOO_SOCKET_IFNAME", TEXT, "", P + "rollout/dp_env.py", "NIC of Gloo's sockets", TORCH),
    _v(
        "TORCH_WARM_POOL",
        TEXT,
        "",
        P + "launch/job.py",
        "Inductor's compile-pool warm-up (the tiny run sets 0 unless given)",
        TORCH,
    ),
    # the CPU numerics the tiny run pins (base/cpu_numerics.py)
    *(
        _v(name, TEXT, "", P + "base/cpu_numerics.py", f"{what} (the tiny run pins {pinned})", TORCH)
        for name, what, pinned in (
            ("ATEN_CPU_CAPABILITY", "ATen's CPU kernels", "avx2"),
            ("MKL_CBWR", "MKL's code branch", "COMPATIBLE"),
            ("ONEDNN_MAX_CPU_ISA", "oneDNN's CPU ISA", "AVX2"),
            ("OMP_NUM_THREADS", "intra-op threads", "1"),
            ("MKL_NUM_THREADS", "MKL threads", "1"),
        )
    ),
    # ---- Ray, verl ----
    _v(
        "RAY_ADDRESS",
        TEXT,
        "",
        P + "patching/ray_runtime.py",
        "a running Ray cluster to join (the cluster launch sets it); unset, the trainer starts a local one",
        RAY,
    ),
    _v("RAY_AUTH_MODE", TEXT, "token", P + "launch/job.py", "Ray's authentication mode", RAY),
    _v(
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        TEXT,
        "",
        P + "patching/ray_runtime.py",
        "the runtime env of a `ray job submit` (set by Ray's job supervisor)",
        RAY,
    ),
    _v("RAY_TMPDIR", TEXT, "/tmp", P + "launch/cluster/node_logs.py", "parent of Ray's session folders", RAY),
    _v(
        "RAY_LOCAL_RANK",
        INT,
        0,
        P + "device.py",
        "the worker's index on its node in verl's Ray worker group",
        VERL,
        minimum=0,
    ),
    _v(
        "TENSORBOARD_DIR",
        TEXT,
        "",
        P + "driver/rank_memory.py",
        "verl's TensorBoard folder (the launcher sets it)",
        VERL,
    ),
    # ---- the system ----
    _v("SOCKET_IFNAME", TEXT, "", P + "rollout/dp_env.py", "the cluster setting's NIC, when exported", OURS),
    _v(
        "PYTHONPATH",
        TEXT,
        "",
        P + "patching/ray_runtime.py " + P + "sources/dist_info.py",
        "extended, never replaced, with the repo root",
        SYSTEM,
    ),
    _v("PATH", TEXT, "", P + "npu_emulation/device/build.py", "searched for the extension's compiler", SYSTEM),
    _v(
        "XDG_CACHE_HOME",
        TEXT,
        "",
        P + "base/user_cache.py " + P + "patching/fingerprint.py",
        "parent of the user caches (default ~/.cache)",
        SYSTEM,
    ),
    _v(
        "PIP_INDEX_URL", TEXT, "", P + "sources/pypi_route.py", "the package index of the set-up (default PyPI)", SYSTEM
    ),
)
REGISTRY: dict[str, Variable] = {v.name: v for v in _VARIABLES}
_FAMILIES = tuple(v for v in _VARIABLES if v.family)


def lookup(name: str) -> Variable | None:
    """The entry of ``name`` (its family's for a family member), None when it is not registered."""
    if name in REGISTRY:
        return REGISTRY[name]
    return next((v for v in _FAMILIES if v.covers(name)), None)


def variable(name: str, kinds: tuple[str, ...] = KINDS) -> Variable:
    """The entry of ``name``; `UnregisteredVariable` when there is none or its kind is not in ``kinds``."""
    var = lookup(name)
    if var is None:
        near = closest(name)
        raise UnregisteredVariable(
            f"{name} is not in verl_patches/base/env_registry.py" + (f" (did you mean {near}?)" if near else "")
        )
    if var.kind not in kinds:
        raise UnregisteredVariable(f"{name} is registered as a {var.kind}, not a {' or '.join(kinds)}")
    return var


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    return (os.environ if environ is None else environ).get(name)


def read(name: str, environ: Mapping[str, str] | None = None) -> object:
    """``name`` of ``environ`` (default: this process's environment) parsed as registered."""
    return variable(name).parse(_raw(name, environ), name)


def flag(name: str, environ: Mapping[str, str] | None = None, *, default: bool | None = None) -> bool:
    """The switch ``name``; ``default`` (else the registered one) when unset. `EnvError` for a bad spelling."""
    return bool(variable(name, (FLAG,)).parse(_raw(name, environ), name, default))


def integer(name: str, environ: Mapping[str, str] | None = None, *, default: int | None = None) -> int:
    """The integer ``name`` within its registered bounds; ``default`` (else the registered one) when unset or
    empty. `EnvError` for a bad value, or when unset with no default."""
    value = variable(name, (INT,)).parse(_raw(name, environ), name, default)
    assert isinstance(value, int)
    return value


def number(name: str, environ: Mapping[str, str] | None = None, *, default: float | None = None) -> float:
    """The finite number ``name`` within its registered bounds; the default when unset or empty."""
    value = variable(name, (FLOAT,)).parse(_raw(name, environ), name, default)
    assert isinstance(value, float)
    return value


def text(name: str, environ: Mapping[str, str] | None = None, *, default: str | None = None) -> str:
    """The text (or choice) ``name`` without surrounding spaces; the default when unset or empty."""
    return str(variable(name, (TEXT, CHOICE, RETIRED)).parse(_raw(name, environ), name, default))


def items(name: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The comma-separated items of ``name`` (a list variable or a family member), empty ones dropped."""
    value = variable(name, (LIST,)).parse(_raw(name, environ), name)
    assert isinstance(value, list)
    return value


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the registered variable ``name`` is set to something other than spaces (not parsed)."""
    variable(name)
    return bool((_raw(name, environ) or "").strip())


def problem(name: str, raw: str) -> str | None:
    """The one-line refusal of ``raw`` as the value of registered ``name`` (what the job would raise), else None."""
    try:
        variable(name).parse(raw, name, default=_ANY_DEFAULT)
    except EnvError as err:
        return str(err)
    return None


_ANY_DEFAULT = 0  # a set-but-empty variable without a default is not an error of its value


def closest(name: str) -> str | None:
    """The registered name nearest to ``name`` (a misspelling), None when none is near."""
    near = difflib.get_close_matches(name, [v.name for v in _VARIABLES if not v.family], n=1, cutoff=0.75)
    return near[0] if near else None


def unregistered_ours(names: Iterable[object]) -> list[str]:
    """The names among ``names`` that look like ours (VERL_PATCHES_*, VERL_OVERLAY_*, VERL_LAUNCH_*) and are not
    registered: a typo, or a variable nothing reads."""
    return sorted(n for n in names if isinstance(n, str) and n.startswith(OUR_PREFIXES) and lookup(n) is None)


# ---- the documentation's table ---------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table() -> str:
    """The documentation's table of environment variables: one row per entry, grouped by whose name it is."""
    rows = [
        "| Variable | Whose | Value | Default | Read by | What it does |",
        "|---|---|---|---|---|---|",
    ]
    order = {w: i for i, w in enumerate(WHOSE)}
    for v in sorted(_VARIABLES, key=lambda v: (order[v.whose], v.name)):
        owners = ", ".join(f"`{o.removeprefix('verl_patches/')}`" for o in v.owners)
        shown = v.name.replace(FAMILY_MARK, "<NAME>")
        value = v.accepted() if v.kind == CHOICE else _cell(v.accepted())
        rows.append(f"| `{shown}` | {v.whose} | {value} | {_cell(v.shown_default())} | {owners} | {_cell(v.doc)} |")
    return "\n".join(rows) + "\n"


def table_block() -> str:
    return f"{TABLE_BEGIN}\n{markdown_table()}{TABLE_END}"


def page_with_table(page: str) -> str:
    """``page`` with the text between its markers replaced by the generated table; ValueError without markers."""
    begin, end = page.find(TABLE_BEGIN), page.find(TABLE_END)
    if begin < 0 or end < begin:
        raise ValueError(f"no '{TABLE_BEGIN}' ... '{TABLE_END}' markers in the page")
    return page[:begin] + table_block() + page[end + len(TABLE_END) :]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.base.env_registry",
        description=f"The environment variables the project reads: {DOC_PAGE}'s table, generated from the registry.",
    )
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the table")
    group.add_argument(
        "--write-docs", type=Path, metavar="PAGE", help=f"replace the table between the markers of PAGE ({DOC_PAGE})"
    )
    args = p.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown_table())
        return 0
    # lazy: the writer is needed only here
    from verl_patches.base.atomic_write import write_text_atomically

    try:
        text_before = args.write_docs.read_text(encoding="utf-8")
        write_text_atomically(args.write_docs, page_with_table(text_before))
    except (OSError, ValueError) as err:
        print(f"env_registry: {args.write_docs}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
