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
    Setting("SOCKET_IFNAME", None, "network interface for HCCL/Gloo sockets, e.g. enp189s0f0; its IPv4 "
            "address is this node's address"),
    Setting("NODE_ROLE", "auto", "head | worker | auto (head when this node owns MASTER_ADDR)"),
    Setting("DIST_CKPT_PATH", None, "Megatron checkpoint directory made by convert_ckpt_deepseek3.py "
            "(true-weight runs only)"),
    Setting("MODEL_PATH", "DeepSeek-V3", "directory with config.json and the tokenizer (make_config.py output)"),
    Setting("DATA_DIR", "data/deepscaler", "directory with train.parquet and test.parquet (json_to_parquet.py output)"),
    Setting("CANN_TOOLKIT_ENV", "/usr/local/Ascend/ascend-toolkit/set_env.sh", "CANN toolkit environment script"),
    Setting("CANN_NNAL_ENV", "/usr/local/Ascend/nnal/atb/set_env.sh", "CANN NNAL/ATB environment script"),
    Setting("JEMALLOC_LIB", "auto", "libjemalloc.so.2 to preload; auto searches the usual places, none disables"),
    Setting("RAY_DASHBOARD_HOST", "127.0.0.1", "address the Ray dashboard binds to (loopback; any other address "
            "also needs --allow-remote-dashboard)"),
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
            value = int(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SettingsError(f"{name}={raw!r} ({self.where(name)}): expected an integer") from None
        if value < 1:
            raise SettingsError(f"{name}={value} ({self.where(name)}): must be at least 1")
        return value

    @property
    def world_size(self) -> int:
        return self.int("NNODES") * self.int("NPUS_PER_NODE")


_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def read_env_file(path: Path) -> dict[str, tuple[str, int]]:
    """KEY=VALUE lines (optional `export`, quotes, # comments) -> {KEY: (value, line)}."""
    out: dict[str, tuple[str, int]] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"--env-file {path}: no such file") from None
    except UnicodeDecodeError as e:
        raise SettingsError(f"--env-file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise SettingsError(f"{path}:{n}: expected KEY=VALUE, got {line.strip()!r}")
        key, raw = m.groups()
        if key not in SETTING_NAMES and not key.startswith(("HCCL_", "ASCEND_", "VLLM_", "RAY_", "PYTORCH_")):
            raise SettingsError(f"{path}:{n}: unknown setting {key!r} (known: {', '.join(SETTING_NAMES)}; "
                                f"HCCL_*, ASCEND_*, VLLM_*, RAY_*, PYTORCH_* pass through to the job)")
        try:
            parts = shlex.split(raw, comments=True)
        except ValueError as e:
            raise SettingsError(f"{path}:{n}: {key}: {e}") from None
        out[key] = (" ".join(parts), n)
    return out


def load_settings(flags: dict[str, str] | None = None, env_file: Path | None = None,
                  environ: dict[str, str] | None = None) -> ClusterSettings:
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
        raise SettingsError(f"{name} is not set: pass --{name.lower().replace('_', '-')} or put {name}=... in "
                            f"the --env-file ({_help(name)})")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*", value):
        raise SettingsError(f"{name}={value!r} ({where}) is neither an IP address nor a host name")
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
        raise SettingsError(f"RAY_DASHBOARD_HOST={raw!r} ({where}): expected an IP address such as 127.0.0.1") from None
    if addr.is_loopback:
        return None
    scope = "every interface" if addr.is_unspecified else f"{raw}"
    if not allow_remote:
        raise SettingsError(f"RAY_DASHBOARD_HOST={raw} ({where}): the Ray dashboard would listen on {scope}, and "
                            f"anyone who reaches it can run code on every node; use 127.0.0.1 (and an SSH tunnel), "
                            f"or pass {ALLOW_REMOTE_DASHBOARD_FLAG} to accept that")
    return (f"WARNING: the Ray dashboard listens on {scope}:{settings.get('RAY_DASHBOARD_PORT')} "
            f"({ALLOW_REMOTE_DASHBOARD_FLAG}); anyone who reaches that port can submit jobs that run on every node: "
            f"firewall it")


def validate_for_cluster(settings: ClusterSettings, needs_checkpoint: bool,
                         allow_remote_dashboard: bool = False) -> list[str]:
    """Errors that make a cluster launch impossible, each naming the variable."""
    errors: list[str] = []
    try:
        dashboard_exposure(settings, allow_remote_dashboard)
    except SettingsError as e:
        errors.append(str(e))
    try:
        validate_address("MASTER_ADDR", settings.get("MASTER_ADDR"), settings.where("MASTER_ADDR"))
    except SettingsError as e:
        errors.append(str(e))
    for name in ("NNODES", "NPUS_PER_NODE", "MASTER_PORT", "RAY_DASHBOARD_PORT", "HCCL_IF_BASE_PORT", "WAIT_TIMEOUT_S"):
        try:
            v = settings.int(name)
            if name.endswith("PORT") and v > 65535:
                errors.append(f"{name}={v} ({settings.where(name)}): not a port number")
        except SettingsError as e:
            errors.append(str(e))
    if not settings.get("SOCKET_IFNAME"):
        errors.append(f"SOCKET_IFNAME is not set: {_help('SOCKET_IFNAME')}")
    role = settings.get("NODE_ROLE")
    if role not in ("head", "worker", "auto"):
        errors.append(f"NODE_ROLE={role!r} ({settings.where('NODE_ROLE')}): expected head, worker or auto")
    if needs_checkpoint and not settings.get("DIST_CKPT_PATH"):
        errors.append(f"DIST_CKPT_PATH is not set: the true-weight run loads {_help('DIST_CKPT_PATH')}")
    return errors


def _help(name: str) -> str:
    return next(s.help for s in SETTINGS if s.name == name)


def describe_settings() -> str:
    """The settings table for --help."""
    width = max(len(s.name) for s in SETTINGS)
    return "\n".join(f"  {s.name:<{width}}  {s.help}" + (f" [default: {s.default}]" if s.default else " [required]"
                                                            if s.name in ("MASTER_ADDR", "SOCKET_IFNAME") else "")
                     for s in SETTINGS)


__all__ = ["ClusterSettings", "SETTINGS", "SettingsError", "load_settings", "read_env_file", "validate_for_cluster",
           "describe_settings", "dashboard_exposure", "ALLOW_REMOTE_DASHBOARD_FLAG"]
