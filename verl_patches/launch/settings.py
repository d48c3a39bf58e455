"""Cluster settings of a launch: from flags, an env file, the environment, then documented defaults.

Nothing here is a placeholder to edit by hand. A missing required value is an error naming the
variable (and the env-file line when the value came from one), never a literal used as an address.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from verl_patches.base.regular_file import FileRefused, read_regular_file
from verl_patches.base.strict_int import IntError, parse_int

MAX_ENV_FILE_BYTES = 1 << 20  # a settings file is a few hundred bytes; a bigger one is not one
# Settings the trainer config reads through ${oc.env:...}: OmegaConf would read a '${' in them as an interpolation
CONFIG_PATH_SETTINGS = ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR")
# ... of which these are given to the trainer as written: a relative checkpoint folder is refused, not completed
AS_WRITTEN_PATH_SETTINGS = ("CKPT_DIR",)
PASS_THROUGH_PREFIXES = ("HCCL_", "ASCEND_", "VLLM_", "RAY_", "PYTORCH_")
# A Linux interface name (IFNAMSIZ 16 with the NUL): what `ip link` lists, never a list or a pattern
_IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,14}")


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None
    help: str
    cluster_only: bool = True  # not needed by the tiny local profile


SETTINGS: tuple[Setting, ...] = (
    Setting("MASTER_ADDR", None, "IPv4 address (or host name) of the head node, reachable from every node"),
    Setting("MASTER_PORT", "29444", "Ray head (GCS) port; also the base of vLLM's DP master ports"),
    Setting("NNODES", "16", "number of nodes in the job"),
    Setting("NPUS_PER_NODE", "16", "NPU dies per node (an A3 node has 8 cards = 16 dies)"),
    Setting(
        "SOCKET_IFNAME",
        None,
        "network interface for HCCL/Gloo sockets, e.g. enp189s0f0; its IPv4 address is this node's address",
    ),
    Setting("NODE_ROLE", "auto", "head | worker | auto (head when this node owns MASTER_ADDR)"),
    Setting(
        "NODES",
        None,
        "every node's address or host name, comma-separated (NNODES of them): the head names those that have not "
        "joined while it waits; gather_logs collects each node's logs after a failure",
    ),
    Setting(
        "DIST_CKPT_PATH",
        None,
        "Megatron checkpoint directory made by convert_ckpt_deepseek3.py (true-weight runs only)",
    ),
    Setting("MODEL_PATH", "DeepSeek-V3", "directory with config.json and the tokenizer (make_config.py output)"),
    Setting("DATA_DIR", "data/deepscaler", "directory with train.parquet and test.parquet (json_to_parquet.py output)"),
    Setting(
        "CKPT_DIR",
        None,
        "checkpoint folder of the A3 profiles (trainer.default_local_dir): absolute, existing, on storage every "
        "node mounts",
    ),
    Setting("CANN_TOOLKIT_ENV", "/usr/local/Ascend/ascend-toolkit/set_env.sh", "CANN toolkit environment script"),
    Setting("CANN_NNAL_ENV", "/usr/local/Ascend/nnal/atb/set_env.sh", "CANN NNAL/ATB environment script"),
    Setting("JEMALLOC_LIB", "auto", "libjemalloc.so.2 to preload; auto searches the usual places, none disables"),
    Setting(
        "RAY_DASHBOARD_HOST",
        "127.0.0.1",
        "address the Ray dashboard binds to (loopback; any other address also needs --allow-remote-dashboard)",
    ),
    Setting("RAY_DASHBOARD_PORT", "8260", "Ray dashboard port"),
    Setting("HCCL_IF_BASE_PORT", "64247", "first port HCCL uses on the host NIC (set once)"),
    Setting("WAIT_TIMEOUT_S", "1800", "how long the head waits for every node's NPUs, and workers for the head"),
    Setting("LOG_DIR", "logs", "parent of the timestamped log directory of each run", cluster_only=False),
)
SETTING_NAMES = tuple(s.name for s in SETTINGS)


@dataclass(frozen=True)
class ClusterSettings:
    values: dict[str, str]
    origin: dict[str, str] = field(default_factory=dict)  # name -> "flag", "env file F:L", "environment", "default"

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def where(self, name: str) -> str:
        return self.origin.get(name, "unset")

    def int(self, name: str) -> int:
        raw = self.values.get(name)
        try:
            value = parse_int(raw if raw is not None else "", name)
        except IntError:
            raise SettingsError(f"{name}={_shown(str(raw))} ({self.where(name)}): expected an integer") from None
        if value < 1:
            raise SettingsError(f"{name}={value} ({self.where(name)}): must be at least 1")
        return value

    @property
    def world_size(self) -> int:
        return self.int("NNODES") * self.int("NPUS_PER_NODE")


_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def _shown(text: str, limit: int = 60) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _control_character(value: str) -> str | None:
    """The first character of ``value`` that no setting may hold (C0/C1 controls but tab, lone surrogates)."""
    for ch in value:
        o = ord(ch)
        if (o < 0x20 and ch != "\t") or 0x7F <= o < 0xA0 or 0xD800 <= o <= 0xDFFF:
            return f"U+{o:04X}"
    return None


def read_env_file(path: Path) -> dict[str, tuple[str, int]]:
    """KEY=VALUE lines (optional `export`, quotes, # comments) -> {KEY: (value, line)}.

    Values are data: quotes are removed as a shell would (`shlex`), but nothing is expanded or run
    (no `$VAR`, no `$(...)`, no `${...}`).
    """
    out: dict[str, tuple[str, int]] = {}
    try:
        data = read_regular_file(path, max_bytes=MAX_ENV_FILE_BYTES)
    except FileRefused as e:
        raise SettingsError(f"--env-file {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SettingsError(f"--env-file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    for n, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        bad = _control_character(line)
        if bad:
            raise SettingsError(f"{path}:{n}: control character {bad} in the line")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise SettingsError(f"{path}:{n}: expected KEY=VALUE, got {_shown(line.strip())}")
        key, raw = m.groups()
        if key not in SETTING_NAMES and not key.startswith(PASS_THROUGH_PREFIXES):
            raise SettingsError(
                f"{path}:{n}: unknown setting {key!r} (known: {', '.join(SETTING_NAMES)}; "
                f"HCCL_*, ASCEND_*, VLLM_*, RAY_*, PYTORCH_* pass through to the job)"
            )
        try:
            parts = shlex.split(raw, comments=True)
        except ValueError as e:
            raise SettingsError(f"{path}:{n}: {key}: {e}") from None
        out[key] = (" ".join(parts), n)
    return out


def load_settings(
    flags: dict[str, str] | None = None, env_file: Path | None = None, environ: dict[str, str] | None = None
) -> ClusterSettings:
    """Flags win over the env file, which wins over the environment, which wins over the defaults."""
    environ = dict(os.environ if environ is None else environ)
    from_file = read_env_file(env_file) if env_file else {}
    values, origin = {}, {}
    for s in SETTINGS:
        if flags and flags.get(s.name) is not None:
            values[s.name], origin[s.name] = flags[s.name], "flag"
        elif s.name in from_file:
            values[s.name], origin[s.name] = from_file[s.name][0], f"{env_file}:{from_file[s.name][1]}"
        elif environ.get(s.name):
            values[s.name], origin[s.name] = environ[s.name], "environment"
        elif s.default is not None:
            values[s.name], origin[s.name] = s.default, "default"
    for key, (value, line) in from_file.items():  # pass-through HCCL_*/ASCEND_*/... variables
        if key not in SETTING_NAMES:
            values[key], origin[key] = value, f"{env_file}:{line}"
    return ClusterSettings(values, origin)


def validate_address(name: str, value: str | None, where: str) -> str:
    if not value:
        raise SettingsError(
            f"{name} is not set: pass --{name.lower().replace('_', '-')} or put {name}=... in "
            f"the --env-file ({_help(name)})"
        )
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not re.fullmatch(
        r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*", value
    ):
        raise SettingsError(f"{name}={_shown(value)} ({where}) is neither an IP address nor a host name")
    return value


ALLOW_REMOTE_DASHBOARD_FLAG = "--allow-remote-dashboard"


def dashboard_exposure(settings: ClusterSettings, allow_remote: bool) -> str | None:
    """None for a dashboard on loopback; a warning when it listens beyond this host and that was asked
    for with --allow-remote-dashboard; else SettingsError. The dashboard accepts job submissions, i.e.
    runs code on every node for whoever can reach it."""
    raw = settings.get("RAY_DASHBOARD_HOST") or "127.0.0.1"
    where = settings.where("RAY_DASHBOARD_HOST")
    if raw == "localhost":
        return None
    try:
        addr = ipaddress.ip_address(raw)
    except ValueError:
        raise SettingsError(
            f"RAY_DASHBOARD_HOST={_shown(raw)} ({where}): expected an IP address such as 127.0.0.1"
        ) from None
    if addr.is_loopback:
        return None
    scope = "every interface" if addr.is_unspecified else f"{raw}"
    if not allow_remote:
        raise SettingsError(
            f"RAY_DASHBOARD_HOST={raw} ({where}): the Ray dashboard would listen on {scope}, and "
            f"anyone who reaches it can run code on every node; use 127.0.0.1 (and an SSH tunnel), "
            f"or pass {ALLOW_REMOTE_DASHBOARD_FLAG} to accept that"
        )
    return (
        f"WARNING: the Ray dashboard listens on {scope}:{settings.get('RAY_DASHBOARD_PORT')} "
        f"({ALLOW_REMOTE_DASHBOARD_FLAG}); anyone who reaches that port can submit jobs that run on every node: "
        f"firewall it"
    )


@dataclass(frozen=True)
class SettingProblem:
    """Why a launch cannot start with these settings, naming the variable.

    ``missing``: the value is absent (a fact the cluster's own env file or flags supply; a preflight on a
    host that does not run the job reports it as not checked here). Every other problem is a value that
    no host can use, refused by the launch and by its dry run alike.
    """

    name: str
    message: str
    missing: bool = False


def validate_socket_ifname(value: str, where: str) -> str:
    if not _IFNAME.fullmatch(value) or value in (".", ".."):
        raise SettingsError(
            f"SOCKET_IFNAME={_shown(value)} ({where}): expected one network interface name such as "
            f"eth0 or enp189s0f0 (letters, digits, '_', '.', ':', '-'; at most 15 characters)"
        )
    return value


def cluster_setting_problems(
    settings: ClusterSettings, needs_checkpoint: bool, allow_remote_dashboard: bool = False
) -> list[SettingProblem]:
    """The one check of cluster settings: the launch refuses to start on any problem, and the dry run
    (the preflight) reports every one that is not `missing` as a failure on any host."""
    problems: list[SettingProblem] = []

    def check(name: str, fn) -> None:  # noqa: ANN001
        try:
            fn()
        except SettingsError as e:
            problems.append(SettingProblem(name, str(e)))

    check("RAY_DASHBOARD_HOST", lambda: dashboard_exposure(settings, allow_remote_dashboard))
    if settings.get("MASTER_ADDR"):
        check(
            "MASTER_ADDR",
            lambda: validate_address("MASTER_ADDR", settings.get("MASTER_ADDR"), settings.where("MASTER_ADDR")),
        )
    else:
        problems.append(
            SettingProblem(
                "MASTER_ADDR",
                f"MASTER_ADDR is not set: pass --master-addr or put "
                f"MASTER_ADDR=... in the --env-file ({_help('MASTER_ADDR')})",
                True,
            )
        )
    for name in ("NNODES", "NPUS_PER_NODE", "MASTER_PORT", "RAY_DASHBOARD_PORT", "HCCL_IF_BASE_PORT", "WAIT_TIMEOUT_S"):
        try:
            v = settings.int(name)
            if name.endswith("PORT") and v > 65535:
                problems.append(SettingProblem(name, f"{name}={v} ({settings.where(name)}): not a port number"))
        except SettingsError as e:
            problems.append(SettingProblem(name, str(e)))
    nic = settings.get("SOCKET_IFNAME")
    if nic:
        check("SOCKET_IFNAME", lambda: validate_socket_ifname(nic, settings.where("SOCKET_IFNAME")))
    else:
        problems.append(SettingProblem("SOCKET_IFNAME", f"SOCKET_IFNAME is not set: {_help('SOCKET_IFNAME')}", True))
    role = settings.get("NODE_ROLE")
    if role not in ("head", "worker", "auto"):
        problems.append(
            SettingProblem(
                "NODE_ROLE",
                f"NODE_ROLE={_shown(str(role))} ({settings.where('NODE_ROLE')}): expected head, worker or auto",
            )
        )
    for name in CONFIG_PATH_SETTINGS:
        check(name, lambda name=name: config_path_value(settings, name))
    if settings.get("NODES"):
        check("NODES", lambda: node_list(settings))
    if needs_checkpoint and not settings.get("DIST_CKPT_PATH"):
        problems.append(
            SettingProblem(
                "DIST_CKPT_PATH",
                f"DIST_CKPT_PATH is not set: the true-weight run loads {_help('DIST_CKPT_PATH')}",
                True,
            )
        )
    return problems


def validate_for_cluster(
    settings: ClusterSettings, needs_checkpoint: bool, allow_remote_dashboard: bool = False
) -> list[str]:
    """Errors that make a cluster launch impossible, each naming the variable (`cluster_setting_problems`)."""
    return [p.message for p in cluster_setting_problems(settings, needs_checkpoint, allow_remote_dashboard)]


def node_list(settings: ClusterSettings) -> list[str]:
    """NODES as a list: NNODES distinct addresses or host names (SettingsError naming the entry at fault)."""
    raw, where = settings.get("NODES") or "", settings.where("NODES")
    if not raw:
        raise SettingsError(f"NODES is not set: pass --nodes or put NODES=... in the --env-file ({_help('NODES')})")
    nodes = [n.strip() for n in raw.split(",")]
    for n in nodes:
        if not n:
            raise SettingsError(f"NODES={_shown(raw)} ({where}): an empty entry")
        validate_address("NODES", n, where)
    repeated = sorted({n for n in nodes if nodes.count(n) > 1})
    if repeated:
        raise SettingsError(f"NODES ({where}): {', '.join(repeated)} listed more than once")
    expected = settings.int("NNODES")
    if len(nodes) != expected:
        raise SettingsError(f"NODES ({where}) lists {len(nodes)} node(s), NNODES is {expected}")
    return nodes


def config_path_value(settings: ClusterSettings, name: str) -> str | None:
    """A path setting the trainer config reads through ``${oc.env:NAME}``, refused when it holds ``${``.

    The value is data, but OmegaConf reads a resolved string that contains ``${`` as a new interpolation when
    verl resolves the config in place (``OmegaConf.resolve``): ``${broken`` stops the trainer with a grammar
    error and ``${x}`` would be looked up as a key. No escaping survives that step, so such a path is refused.
    """
    value = settings.get(name)
    if value is not None and "${" in value:
        raise SettingsError(
            f"{name}={_shown(value)} ({settings.where(name)}): contains '${{', which the trainer's "
            f"config (OmegaConf) would read as an interpolation; rename the path or link it "
            f"from a path without '${{'"
        )
    return value


def _help(name: str) -> str:
    return next(s.help for s in SETTINGS if s.name == name)


def describe_settings() -> str:
    """The settings table for --help."""
    width = max(len(s.name) for s in SETTINGS)
    return "\n".join(
        f"  {s.name:<{width}}  {s.help}"
        + (
            f" [default: {s.default}]"
            if s.default
            else " [required]"
            if s.name in ("MASTER_ADDR", "SOCKET_IFNAME", "CKPT_DIR")
            else ""
        )
        for s in SETTINGS
    )


__all__ = [
    "ClusterSettings",
    "SETTINGS",
    "SettingsError",
    "SettingProblem",
    "load_settings",
    "read_env_file",
    "validate_for_cluster",
    "cluster_setting_problems",
    "config_path_value",
    "node_list",
    "describe_settings",
    "dashboard_exposure",
    "ALLOW_REMOTE_DASHBOARD_FLAG",
]
