"""`python -m verl_patches.launch.job`: the one launcher behind train_deepseekv3_256die_*.sh.

The same command runs on every node. The head (the node that owns MASTER_ADDR, or NODE_ROLE=head)
runs the preflight, starts Ray bound to its SOCKET_IFNAME address with the dashboard on localhost,
waits for every node's NPUs with a progress line and a timeout, checks on every node that the checkpoint
folder is one storage they can all write, with room (`checkpoint_nodes`), runs the trainer, and stops the Ray
processes it started when the trainer ends (or fails, or is interrupted). A worker joins with
retries and exits when the head goes away. Nothing else on the node is touched: no `pkill`, no
`ray stop`. Logs and recorded process ids (the launcher's own among them, by pid and start time: `pid_record`)
go to LOG_DIR/<profile>-<timestamp>-<role>-<host>/; `python -m verl_patches.launch.cluster.stop RUN_DIR` stops them.
With --ray-only the head holds the cluster for `ray job submit` instead of running the trainer.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from verl_patches.base import node_ip as node_addresses
from verl_patches.base.cpu_numerics import pinned
from verl_patches.base.env_flags import EnvError
from verl_patches.base.free_port import PortBlockError, free_port_block
from verl_patches.base.job_layout import JobLayoutError, job_layout
from verl_patches.base.node_ip import NetworkError, is_this_node
from verl_patches.device import device_kind
from verl_patches.launch import job_env, restart_policy, restarts
from verl_patches.launch.failure_diagnosis import Cause, LostNode, lost_since
from verl_patches.launch.failure_diagnosis import diagnose as diagnose_failure
from verl_patches.launch.pid_record import record_text
from verl_patches.launch.restart_policy import DEFAULT_A3_RESTARTS
from verl_patches.launch.run_dir import check_log_root, make_log_root, new_run_dir
from verl_patches.launch.settings import (
    ALLOW_REMOTE_DASHBOARD_FLAG,
    SETTINGS,
    ClusterSettings,
    SettingsError,
    cluster_setting_problems,
    dashboard_exposure,
    describe_settings,
    load_settings,
    node_list,
)
from verl_patches.process_identity import ProcessId, become_subreaper
from verl_patches.resilience.hang_diagnosis import last_report
from verl_patches.rollout.dp_env import DpEnvError, dp_base_port, host_address, port_block
from verl_patches.rollout.kv_nz_switch import kv_nz_env
from verl_patches.sources.pins import check as check_package_versions
from verl_patches.trainer.entries import CPU_PROOF_ENTRY, TRAINER_ENTRY
from verl_patches.trainer.profiles import CLUSTER_PROFILES, PROFILES, TINY_CONFIGS
from verl_patches.worker_calls.env_names import DP_BASE_PORT_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
NPU_RESOURCE = "NPU"
TINY_RESTARTS = 0  # --tiny's default: README command 1 still fails visibly; `--max-restarts N` asks for restarts
RUN_DIR_ENV = "VERL_PATCHES_RUN_DIR"  # the run folder, for the trainer's and the workers' files (rank memory, ...)


SCRIPT_PROFILE_ENV = "VERL_LAUNCH_PROFILE"  # set by launch_job.sh (so by train_*.sh): the profile the script runs


def add_profile_argument(p: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ) -> str | None:
    """--profile: required when the launcher is run directly; the script's profile, optional and stated in
    --help, when a script fixes it (`SCRIPT_PROFILE_ENV`). Returns that fixed profile, or None."""
    fixed = environ.get(SCRIPT_PROFILE_ENV) or None
    if fixed is not None and fixed not in CLUSTER_PROFILES:
        print(f"{p.prog}: unknown profile {fixed!r}; one of {', '.join(sorted(CLUSTER_PROFILES))}", file=sys.stderr)
        raise SystemExit(2)
    if fixed is None:
        p.add_argument("--profile", choices=sorted(CLUSTER_PROFILES), required=True)
    else:
        p.add_argument(
            "--profile",
            choices=sorted(CLUSTER_PROFILES),
            default=fixed,
            help=f"{fixed} (this script's; another profile is refused: "
            "`bash verl_patches/scripts/launch_job.sh PROFILE ...` runs any)",
        )
    return fixed


def refuse_other_profile(args: argparse.Namespace, fixed: str | None, prog: str) -> None:
    """A --profile that contradicts the script's own is one line and exit 2, never silently another run."""
    if fixed is not None and args.profile != fixed:
        print(
            f"{prog}: runs profile {fixed}; --profile {args.profile} contradicts it "
            f"(for that profile: bash verl_patches/scripts/launch_job.sh {args.profile} ...)",
            file=sys.stderr,
        )
        raise SystemExit(2)


def restart_count(text: str) -> int:
    """--max-restarts: 0 or more, ASCII digits only."""
    if not (text.isascii() and text.isdigit()) or len(text) > 3:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of restarts, 0 to 999")
    return int(text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=os.environ.get("VERL_LAUNCH_PROG", "python -m verl_patches.launch.job"),
        description="Launch DeepSeek-V3 GRPO on an Atlas A3 cluster (run the same command on every node), "
        "check it first with --dry-run, or run the tiny local profile with --tiny.",
        epilog="settings (flag, env file or environment; flags win):\n"
        + describe_settings()
        + "\n\nAnything after `--` is passed to the trainer as Hydra overrides.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fixed = add_profile_argument(p)
    p.add_argument("--env-file", type=Path, help="KEY=VALUE file with the settings below")
    p.add_argument("--dry-run", action="store_true", help="run the preflight only and exit")
    p.add_argument("--tiny", action="store_true", help="the tiny local profile on this host (no cluster)")
    p.add_argument(
        "--tiny-engine",
        choices=sorted(TINY_CONFIGS),
        default="megatron",
        help="with --tiny: megatron (default; the A3 job's path) or fsdp (verl's FSDP actor + HF rollout)",
    )
    p.add_argument(
        "--ray-only",
        action="store_true",
        help="the head brings the cluster up (preflight, Ray, every node's NPUs, the checkpoint folder) and holds it "
        "for `ray job submit` instead of running the trainer; it prints the submit command",
    )
    p.add_argument(
        "--max-restarts",
        type=restart_count,
        default=None,
        metavar="N",
        help=f"after a failure (hang, dead worker, HCCL error, lost node) diagnose it, end what the trainer left and "
        f"run it again from the last committed checkpoint, at most N times; stops when the same step fails twice "
        f"(default {DEFAULT_A3_RESTARTS} on the cluster, 0 with --tiny; needs trainer.save_freq > 0)",
    )
    p.add_argument(
        ALLOW_REMOTE_DASHBOARD_FLAG,
        dest="allow_remote_dashboard",
        action="store_true",
        help="accept a RAY_DASHBOARD_HOST other than loopback (anyone who reaches the dashboard can run "
        "code on every node; a warning is printed)",
    )
    for s in SETTINGS:
        p.add_argument(f"--{s.name.lower().replace('_', '-')}", dest=s.name, metavar=s.name)
    args, rest = p.parse_known_args(argv)
    refuse_other_profile(args, fixed, p.prog)
    if rest and rest[0] == "--":
        rest = rest[1:]
    bad = [r for r in rest if r.startswith("-")]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = rest
    return args


class Launch:
    """One launch on one node: its settings, log directory and the processes it owns."""

    def __init__(self, args: argparse.Namespace, settings: ClusterSettings, role: str) -> None:
        self.args, self.settings, self.role = args, settings, role
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = "tiny" if args.tiny else args.profile
        log_root = Path(settings.get("LOG_DIR") or "logs")
        if not log_root.is_absolute():
            log_root = REPO_ROOT / log_root
        make_log_root(log_root)
        warning = check_log_root(log_root)
        # made 0700 and held open: the launcher's files are created through its descriptor (run_dir)
        self.run = new_run_dir(log_root, f"{name}-{stamp}-{role}-{socket.gethostname()}")
        self.log_dir = self.run.path
        self.owned: dict[str, int] = {}
        self.keep: list[int] = []  # processes (and their subtrees) ended by their own code, not as leftovers
        # a stop request (Ctrl-C, launch.cluster.stop) was passed on to the trainer: never restarted
        self.stopped = False
        self._log = self.run.open_new("launcher.log", "a")
        self.record("launcher", os.getpid())  # `launch.cluster.stop RUN_DIR` asks it to stop, as Ctrl-C would
        self.subreaper = become_subreaper()  # orphans of the job stay findable (session_leftovers)
        if warning:
            self.say(warning)

    def say(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self._log.write(line + "\n")
        self._log.flush()

    def record(self, name: str, pid: int) -> None:
        self.owned[name] = pid
        self.run.write_text("pids.json", record_text(self.owned))  # each by pid and start time

    def open_log(self, path: Path, mode: str = "ab") -> Any:
        """A new file of the run folder (``path`` must be in it), created through the folder's descriptor."""
        if path.parent != self.log_dir:
            raise ValueError(f"{path}: not a file of this launch's run folder {self.log_dir}")
        return self.run.open_new(path.name, mode)


PIPE_DRAIN_S = 2.0  # after the trainer exits, how long its output may still arrive before cleanup starts


def run_logged(
    cmd: list[str], log_path: Path, env: dict[str, str], launch: Launch, name: str, log: Any | None = None
) -> int:
    """Run a child in a session of its own, with its output both on the console and in its log (``log``, an open
    file of the run folder, when given: the trainer's runs of one launch share trainer.log); forward
    Ctrl-C/TERM to it; once it has exited, end what is left of its session (session_leftovers).

    The output is copied by a thread and the launcher waits for the child itself: a leftover that keeps the
    child's stdout open cannot hold the launcher (the copy gets `PIPE_DRAIN_S`, then the cleanup ends the
    holder, which closes the pipe)."""
    if log is None:
        with launch.open_log(log_path) as own:
            return run_logged(cmd, log_path, env, launch, name, own)
    # lazy: that module loads psutil; importing this one must not
    from verl_patches.launch.session_leftovers import end_session_leftovers, wait_exited

    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True
    )
    leader = ProcessId.of(proc.pid)  # our unreaped child: the number is its own; names its session below
    launch.record(name, proc.pid)

    def forward(signum: int, _frame: Any) -> None:
        launch.stopped = True
        if proc.returncode is None:  # not reaped before the cleanup below: its group id is still its own
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:  # exited, and nothing of its group is left to tell
                pass

    def copy() -> None:
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.readline(), b""):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            log.write(chunk)

    reader = threading.Thread(target=copy, name=f"{name}-output", daemon=True)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        reader.start()
        wait_exited(proc.pid)  # not reaped yet: no other process can be given its number (its session's id)
        reader.join(PIPE_DRAIN_S)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    # the child's own session, and what left it: what it started and left running
    end_session_leftovers(leader, launch.say, adopted_from=os.getpid() if launch.subreaper else None, keep=launch.keep)
    rc = proc.wait()
    reader.join(PIPE_DRAIN_S)
    if reader.is_alive():
        launch.say(
            f"the {name}'s output pipe is still held open by a process outside this launch's reach; not waiting for it"
        )
    return rc


def trainer_command(config_name: str, overrides: list[str]) -> list[str]:
    """The trainer's command line: the CPU proof's entry for a tiny config, else the trainer entry."""
    entry = CPU_PROOF_ENTRY if config_name in TINY_CONFIGS.values() else TRAINER_ENTRY
    return [sys.executable, "-m", entry, "--config-name", config_name, *overrides]


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    from verl_patches.sources.dist_info import path_entry  # vllm/vllm_ascend metadata and entry points

    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), path_entry(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


SOURCE_SCRIPT = 'for f in "$@"; do source "$f" >/dev/null 2>&1; done; env -0'


def source_scripts(paths: list[str]) -> dict[str, str]:
    """The environment after `source`-ing shell scripts (the CANN set_env.sh files), as a dict.

    The paths reach bash as positional arguments, never inside the command text, so a quote or `$(...)`
    in a path is only a file name; absolute, so none can start with '-'.
    """
    args = [str(Path(p).absolute()) for p in paths]
    out = subprocess.run(["bash", "-c", SOURCE_SCRIPT, "source_scripts", *args], capture_output=True, check=True).stdout
    return dict(item.split("=", 1) for item in out.decode(errors="replace").split("\0") if "=" in item)


def no_compile_pool(environ: dict[str, str]) -> dict[str, str]:
    """TORCH_WARM_POOL=0 unless the user set it (pure).

    With the x86-64 torch wheel (it ships Triton), the first ``torch.compile`` decoration (Megatron's fusions, at
    import) pre-starts Inductor's compile pool in every process: a process that imports torch (about 3 s of CPU)
    and two forks of it, about 1 GB resident per Ray worker, which the tiny run never uses. Without the warm-up
    Inductor starts the pool on first use instead, so nothing else changes; aarch64 wheels (A3) have no Triton
    and never warm it.
    """
    return {} if "TORCH_WARM_POOL" in environ else {"TORCH_WARM_POOL": "0"}


def tiny_dp_ports(count: int, host: str) -> int:
    """The first of ``count`` ports free on ``host``, outside its ephemeral range and Ray's own ports."""
    from verl_patches.launch.cluster.ray_cluster import RAY_OWN_PORTS  # lazy, as the cluster path loads it

    return free_port_block(count, host, avoid=list(RAY_OWN_PORTS.values()))


def tiny_rollout_env(
    config_name: str,
    overrides: list[str],
    environ: Mapping[str, str],
    pick_ports: Callable[[int, str], int] = tiny_dp_ports,
) -> dict[str, str]:
    """What the cluster launch exports from the composed config for the rollout, for the tiny run: the
    instance's DP size (``overlay.vllm_dp_size`` as VLLM_DP_SIZE: expert parallelism across the instance's
    ranks), the F4 switch, and the base of the DP master ports, so its engines are built as the cluster's.

    The cluster's base is its MASTER_PORT setting, checked by the preflight; the tiny run has no such setting
    and runs beside other jobs and tests on one host, so its DP master ports are a block free on this host
    now, outside the ephemeral range and Ray's own ports (`tiny_dp_ports`), unless ``environ`` already names them."""
    # lazy: these load Hydra and omegaconf; importing this module must not
    from verl_patches.launch.preflight.env import DP_MASTER_PORT, dp_master_port_findings, seen_variables
    from verl_patches.launch.preflight.host import vllm_dp_port_count
    from verl_patches.trainer.config_compose import compose_config, resolved

    cfg = resolved(compose_config(config_name, overrides))
    dp = job_layout(cfg).rollout.dp_per_instance
    out = {"VLLM_DP_SIZE": str(dp), **kv_nz_env(cfg)}
    if dp > 1 and environ.get(DP_MASTER_PORT):  # set by hand it turns the per-rank export off: refused, named
        raise DpEnvError(dp_master_port_findings(seen_variables(None, environ), dp)[0].message)
    if dp <= 1:
        return out
    if environ.get(DP_BASE_PORT_ENV):
        # the user's value: refused here, with its name, not in every worker later; so is a block past 65535
        port_block(dp_base_port(environ), vllm_dp_port_count(cfg))
        return out
    out[DP_BASE_PORT_ENV] = str(pick_ports(vllm_dp_port_count(cfg), host_address(environ)) - 1)
    return out


def run_tiny(args: argparse.Namespace, settings: ClusterSettings) -> int:
    # lazy: that module loads omegaconf; importing this one must not
    from verl_patches.trainer.config_compose import ConfigCompositionError

    try:
        setting, root = tiny_restart_setting(args)
    except ConfigCompositionError as e:
        print(f"launch: the tiny config does not compose: {e}", file=sys.stderr)
        return 2
    if setting.refusal:
        print(f"launch: {setting.refusal}", file=sys.stderr)
        return 2
    launch = Launch(args, settings, "local")
    launch.say(f"tiny local profile on this {device()} host; logs in {launch.log_dir}")
    env = base_env()

    pins = pinned(env) if device() == "cpu" else {}
    env.update(pins)  # one CPU code path on every x86-64 host: the golden baseline holds across machines
    if pins:
        launch.say(
            "CPU kernels pinned to one code path on every x86-64 host and one thread per process: "
            + " ".join(f"{k}={v}" for k, v in pins.items())
        )
    if device() == "cpu":
        env.update(no_compile_pool(env))
    # vLLM's and vllm-ascend's variables as the A3 job exports them (V1 engine, vllm-ascend's sampler): the
    # rollout takes A3's code paths; a value the user set wins
    for key, value in job_env.rollout_engine_environment().items():
        env.setdefault(key, value)
    # lazy: that module loads omegaconf; importing this one must not
    from verl_patches.trainer.config_compose import ConfigCompositionError

    try:
        rollout_env = tiny_rollout_env(TINY_CONFIGS[args.tiny_engine], list(args.overrides), env)
    except ConfigCompositionError as e:
        launch.say(f"the tiny config does not compose: {e}")
        return 2
    except JobLayoutError as e:
        launch.say(f"the tiny config's layout does not hold: {e}")
        return 2
    except (DpEnvError, PortBlockError) as e:
        launch.say(f"no ports for vLLM's DP groups: {e}")
        return 2
    env.update(rollout_env)
    if DP_BASE_PORT_ENV in rollout_env:
        launch.say(
            f"vLLM DP master ports from {int(rollout_env[DP_BASE_PORT_ENV]) + 1} "
            f"({DP_BASE_PORT_ENV}={rollout_env[DP_BASE_PORT_ENV]}): free on this host, outside its ephemeral "
            "range and Ray's ports"
        )
    env.setdefault("TENSORBOARD_DIR", str(launch.log_dir / "tensorboard"))
    env["VERL_PATCHES_ACTIVATION_DIR"] = str(launch.log_dir / "activations")  # one record per patched process
    # the trainer's run folder (rank memory, resolved config, curves; fault injections fire once per run folder)
    # is this launch's, whatever the shell exported: a user's TENSORBOARD_DIR or a stale value must not move it
    env[RUN_DIR_ENV] = str(launch.log_dir)

    def exit_line(rc: int, seconds: float) -> str:
        return (
            f"trainer exited with status {rc} after {seconds:.0f} s wall time "
            f"({TINY_CONFIGS[args.tiny_engine]}); TensorBoard logs: {env['TENSORBOARD_DIR']}"
        )

    outcome = run_trainer_restarting(
        launch,
        trainer_command(TINY_CONFIGS[args.tiny_engine], args.overrides),
        env,
        setting,
        exit_line,
        node=socket.gethostname(),
        root=root,
    )
    if not setting.restarts:
        say_hang_report(launch, outcome.returncode)
    return outcome.returncode


def tiny_restart_setting(args: argparse.Namespace) -> tuple[restart_policy.RestartSetting, Path | None]:
    """--max-restarts for the tiny run (default 0: README command 1 fails as it always did) and its checkpoint
    root; the config is composed only when restarts are asked for."""
    if not args.max_restarts:
        return restart_policy.RestartSetting(0), None
    # lazy: these load Hydra and omegaconf; importing this module must not
    from verl_patches.trainer.config_compose import compose_config, resolved

    cfg = resolved(compose_config(TINY_CONFIGS[args.tiny_engine], list(args.overrides)))
    return restart_setting_of(args, cfg, TINY_RESTARTS), checkpoint_root_of(cfg)


def restart_setting_of(args: argparse.Namespace, cfg: Any, default: int) -> restart_policy.RestartSetting:
    # lazy: omegaconf is heavy and only this path needs it; importing this module stays light
    from omegaconf import OmegaConf

    return restart_policy.restart_setting(
        args.max_restarts,
        default,
        OmegaConf.select(cfg, "trainer.save_freq"),
        OmegaConf.select(cfg, "trainer.resume_mode", default="auto"),
        checkpoint_root_of(cfg),
    )


def checkpoint_root_of(cfg: Any) -> Path | None:
    """The trainer's checkpoint root (`trainer.default_local_dir`; relative to the repo root, the trainer's
    working directory), or None when the config has none."""
    # lazy: omegaconf is heavy and only this path needs it; importing this module stays light
    from omegaconf import OmegaConf

    folder = OmegaConf.select(cfg, "trainer.default_local_dir")
    if not folder:
        return None
    return Path(folder) if Path(folder).is_absolute() else REPO_ROOT / folder


def run_trainer_restarting(
    launch: Launch,
    cmd: list[str],
    env: dict[str, str],
    setting: restart_policy.RestartSetting,
    exit_line: Callable[[int, float], str],
    node: str,
    root: Path | None = None,
    cluster: bool = False,
    before_restart: Callable[[], None] = lambda: None,
    lost_nodes: Callable[[], list[LostNode]] = list,
) -> restarts.Outcome:
    """The trainer, run again after a failure as `restarts.supervise` decides (not at all with 0 restarts); every
    run's output goes to the console and to the one trainer.log of the run folder."""
    log_path = launch.log_dir / "trainer.log"
    if setting.note:
        launch.say(setting.note)
    if setting.restarts:
        backoff = restart_policy.Backoff()
        launch.say(
            f"restarts: up to {setting.restarts} after a failure, each from the last committed checkpoint under "
            f"{root} after {backoff.first_s:g} s doubling to at most {backoff.cap_s:g} s; none when the same step "
            "fails twice (--max-restarts)"
        )
    with launch.open_log(log_path) as log:

        def run_once(n: int) -> restarts.Run:
            if n:
                log.write(f"[launcher] restart {n}: the same command again\n".encode())
            log.flush()
            start_at, t0 = log.tell(), time.monotonic()
            rc = run_logged(cmd, log_path, env, launch, "trainer", log)
            log.flush()
            launch.say(exit_line(rc, time.monotonic() - t0))
            output = restarts.read_run_output(log_path, start_at) if rc != 0 and setting.restarts else ""
            return restarts.Run(rc, output, launch.owned.get("trainer", 0), launch.stopped)

        def diagnose(run: restarts.Run) -> Cause:
            report = last_report(run.output)
            if report:
                launch.say(report)  # the driver's report, repeated for each failed run
            return diagnose_failure(run.output, run.returncode, node, run.pid, lost_nodes(), run.stopped)

        return restarts.supervise(
            run_once,
            diagnose,
            lambda: restarts.committed_step(root, cluster, env) if root is not None else 0,
            setting.restarts,
            launch.say,
            before_restart=before_restart,
        )


def say_hang_report(launch: Launch, rc: int) -> None:
    """After a failed trainer, repeat the driver's hang report (rank, node, pid, phase, step) as the last line."""
    if rc == 0:
        return

    try:
        report = last_report((launch.log_dir / "trainer.log").read_text(errors="replace"))
    except OSError:
        return
    if report:
        launch.say(report)


def device() -> str:
    return device_kind()


def job_overrides(args: argparse.Namespace, settings: ClusterSettings) -> list[str]:
    """The profile, the cluster shape from the settings, then the user's overrides (which win)."""
    if args.tiny:
        return list(args.overrides)
    return [
        *PROFILES[args.profile].overrides,
        f"trainer.nnodes={settings.int('NNODES')}",
        f"trainer.n_gpus_per_node={settings.int('NPUS_PER_NODE')}",
        *args.overrides,
    ]


def run_preflight(args: argparse.Namespace, settings: ClusterSettings) -> int:
    """The dry run, and the launch's own preflight: the settings are judged by the check the launch uses
    (`settings.cluster_setting_problems`, reported by the preflight), the config as the job composes it."""
    # lazy: that module loads omegaconf; importing this one must not
    from verl_patches.launch.preflight import report as preflight
    from verl_patches.trainer.config_compose import ConfigCompositionError

    config_name = TINY_CONFIGS[args.tiny_engine] if args.tiny else PROFILES[args.profile].config_name
    try:
        overrides = job_overrides(args, settings)  # the cluster shape from NNODES / NPUS_PER_NODE
        cfg = preflight.compose(config_name, overrides, settings, REPO_ROOT)
    except (SettingsError, ConfigCompositionError) as e:
        print(f"preflight: {e}", file=sys.stderr)
        return 2
    return preflight.report(
        cfg, config_name, overrides, settings, REPO_ROOT, allow_remote_dashboard=args.allow_remote_dashboard
    )


def decide_role(settings: ClusterSettings) -> str:
    role = settings.get("NODE_ROLE") or "auto"
    if role != "auto":
        return role
    return "head" if is_this_node(settings.get("MASTER_ADDR") or "") else "worker"


def ray_auth_env() -> dict[str, str]:
    """Ray releases with token authentication need the mode set for every client of the cluster."""
    try:
        # probe: only Ray releases with token authentication have this module
        import ray._private.authentication.authentication_token_setup  # noqa: F401
    except ImportError:
        return {}
    return {"RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}


def use_ray_auth_here(auth: dict[str, str]) -> None:
    """Give this process (the head's wait for NPUs is a Ray client) the cluster's authentication mode.

    Ray caches RAY_AUTH_MODE when it is first imported (ray_auth_env already imported it), so setting the
    variable alone is not seen: the client would connect without the token and be refused until the
    wait times out. Ray's own helper sets the variable and refreshes that cache.
    """
    os.environ.update(auth)
    if auth.get("RAY_AUTH_MODE") == "token":
        try:
            # probe: only Ray releases with token authentication have this helper
            from ray._private.authentication.authentication_token_setup import _enable_token_auth
        except ImportError:  # a Ray without the helper reads the variable at connect time
            return
        _enable_token_auth()


def run_cluster(args: argparse.Namespace, settings: ClusterSettings) -> int:
    # lazy: preflight loads omegaconf; importing this module must not
    from verl_patches.checkpoint.root_access import cluster_run
    from verl_patches.launch.cluster import node_roster, ray_cluster
    from verl_patches.launch.preflight import checkpoint_nodes
    from verl_patches.launch.preflight import env as preflight_env
    from verl_patches.launch.preflight import report as preflight
    from verl_patches.launch.preflight import vendor_env as preflight_vendor_env

    profile = PROFILES[args.profile]
    config_name = profile.config_name
    problems = cluster_setting_problems(
        settings, needs_checkpoint=profile.needs_checkpoint, allow_remote_dashboard=args.allow_remote_dashboard
    )
    if len(problems) == 1:
        print(f"launch: cannot start: {problems[0].message}", file=sys.stderr)
        return 2
    if problems:  # one line per problem, so each names its variable
        print("launch: cannot start:\n  - " + "\n  - ".join(p.message for p in problems), file=sys.stderr)
        return 2
    exposure = dashboard_exposure(settings, args.allow_remote_dashboard)
    node_ip = node_addresses.interface_ipv4(settings.get("SOCKET_IFNAME") or "")
    master = node_addresses.resolve_ipv4(settings.get("MASTER_ADDR") or "")
    role = decide_role(settings)
    launch = Launch(args, settings, role)
    # The same composition the preflight checks, so the trainer runs exactly what was checked.
    cfg = preflight.compose(config_name, job_overrides(args, settings), settings, REPO_ROOT)
    # the vendor's variables, judged on every node (a worker's shell may carry them too), before anything starts
    vendor = preflight_vendor_env.vendor_findings(
        preflight_vendor_env.seen_variables(settings, os.environ), cfg, settings.world_size
    )
    layout = job_layout(cfg)  # JobLayoutError, naming the key, for a layout that does not hold: main says it
    vendor += preflight_env.dp_master_port_findings(  # the rest of the environment was judged in main
        preflight_env.seen_variables(settings, os.environ), layout.rollout.dp_per_instance
    )
    refused = [f.message for f in vendor if f.status == "fail"]
    if refused:
        print("launch: cannot start:\n  - " + "\n  - ".join(refused), file=sys.stderr)
        return 2
    restart = restart_setting_of(args, cfg, DEFAULT_A3_RESTARTS)  # judged on every node, as the same command runs
    if args.ray_only and args.max_restarts:
        restart = restart_policy.RestartSetting(
            0,
            refusal=f"--max-restarts {args.max_restarts} with --ray-only: the trainer is then a `ray job submit` "
            "of yours, which this launcher neither runs nor restarts",
        )
    if restart.refusal:
        print(f"launch: cannot start: {restart.refusal}", file=sys.stderr)
        return 2
    env = base_env()
    env.update(
        source_scripts(
            [p for p in (settings.get("CANN_TOOLKIT_ENV"), settings.get("CANN_NNAL_ENV")) if p and Path(p).is_file()]
        )
    )
    env.update(job_env.as_dict(job_env.job_environment(settings, layout.rollout.dp_per_instance)))
    env.update(kv_nz_env(cfg))  # F4 is installed at process start, from the config's KV-NZ setting
    env.update(preflight.path_environment(settings, REPO_ROOT))  # absolute, as the profiles read them
    env["TENSORBOARD_DIR"] = str(launch.log_dir / "tensorboard")
    env[RUN_DIR_ENV] = str(launch.log_dir)
    auth = ray_auth_env()
    env.update(auth)
    use_ray_auth_here(auth)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 32768), hard), hard))
    npus = settings.int("NPUS_PER_NODE")
    address = f"{master}:{settings.int('MASTER_PORT')}"
    timeout = float(settings.int("WAIT_TIMEOUT_S"))
    launch.say(
        f"{role} on {socket.gethostname()} ({node_ip}); cluster {settings.get('NNODES')} x {npus} NPUs; "
        f"head {address}; logs in {launch.log_dir}"
    )
    for f in vendor:
        if f.status == "warn":
            launch.say(f"note: {f.message}")
    if role == "worker":
        node = ray_cluster.join_with_retries(
            ray_cluster.worker_command(address, node_ip, npus, NPU_RESOURCE),
            launch.log_dir / "ray.log",
            timeout,
            env,
            launch.say,
        )
        launch.record("ray", node.pid)
        try:
            rc = node.process.wait()
            launch.say(f"the head went away (ray exited with {rc}); this node is done")
            return 0
        except KeyboardInterrupt:
            return 130
        finally:
            node.stop()

    if exposure:
        launch.say(exposure)
    if run_preflight(args, settings) != 0:
        launch.say("preflight failed: nothing was started")
        return 1
    head = ray_cluster.start_node(
        ray_cluster.head_command(
            node_ip,
            settings.int("MASTER_PORT"),
            npus,
            NPU_RESOURCE,
            settings.get("RAY_DASHBOARD_HOST") or "127.0.0.1",
            settings.int("RAY_DASHBOARD_PORT"),
        ),
        "head",
        launch.log_dir / "ray.log",
        env,
        address=f"{node_ip}:{settings.int('MASTER_PORT')}",
    )
    launch.record("ray", head.pid)
    launch.keep.append(head.pid)  # stopped by ray_cluster below, not as a leftover of the trainer
    rc = 1
    last_line = ""

    def wait_for_every_node() -> None:
        ray_cluster.wait_for_resource(
            address,
            NPU_RESOURCE,
            float(settings.world_size),
            settings.int("NNODES"),
            timeout,
            head=head,
            progress=launch.say,
            # NODES, when the env file has it: the nodes that have not joined are named with what was last seen
            nodes=node_roster.expected_nodes(node_list(settings)) if settings.get("NODES") else (),
            per_node=float(npus),
        )

    try:
        wait_for_every_node()
        # the checkpoint folder, judged on every node now that all joined: one storage, writable, with room
        if not checkpoint_nodes.check_on_every_node(address, cfg, settings, REPO_ROOT, launch.say):
            return 1
        if args.ray_only:
            return hold_for_ray_jobs(launch, head, settings, config_name, job_overrides(args, settings))
        env["RAY_ADDRESS"] = address
        # Ray's node table before each run: a node it marks dead during the run is named as the failure's cause
        dead_before = restarts.dead_nodes(address, NPU_RESOURCE)

        def lost_nodes() -> list[LostNode]:
            return lost_since(dead_before, restarts.dead_nodes(address, NPU_RESOURCE))

        def before_restart() -> None:
            wait_for_every_node()  # a lost node must be back (or replaced) before the next run
            dead_before[:] = restarts.dead_nodes(address, NPU_RESOURCE)

        outcome = run_trainer_restarting(
            launch,
            trainer_command(config_name, job_overrides(args, settings)),
            env,
            restart,
            lambda status, _s: f"trainer exited with status {status}",
            node=f"{node_ip} {socket.gethostname()}",
            root=checkpoint_root_of(cfg),
            cluster=cluster_run(cfg),
            before_restart=before_restart,
            lost_nodes=lost_nodes,
        )
        rc, last_line = outcome.returncode, outcome.last_line
        return rc
    except ray_cluster.RayClusterError as e:
        launch.say(f"error: {e}")
        return 1
    finally:
        launch.say("stopping the Ray processes this launch started")
        head.stop()
        if restart.restarts:
            if last_line:  # why the launch ended after its restarts: its last line, as the hang report was
                launch.say(last_line)
        else:
            say_hang_report(launch, rc)


def submit_command(dashboard: str, config_name: str, overrides: list[str]) -> list[str]:
    """`ray job submit` of the trainer entry with the launch's own overrides, against this head's dashboard."""
    return [
        "ray", "job", "submit", "--address", dashboard, "--no-wait", "--",
        "python3", "-m", TRAINER_ENTRY, "--config-name", config_name, *overrides,
    ]  # fmt: skip


def hold_for_ray_jobs(
    launch: Launch, head: Any, settings: ClusterSettings, config_name: str, overrides: list[str]
) -> int:
    """--ray-only: keep the cluster up for `ray job submit` until the head exits or this launcher is stopped
    (Ctrl-C or `launch.cluster.stop`); the caller then stops the Ray node it started."""
    dashboard = f"http://{settings.get('RAY_DASHBOARD_HOST') or '127.0.0.1'}:{settings.int('RAY_DASHBOARD_PORT')}"
    submit = shlex.join(submit_command(dashboard, config_name, overrides))
    launch.say(f"cluster ready; submit the trainer from this node: {submit}")
    launch.say(f"stop the cluster with: python3 -m verl_patches.launch.cluster.stop {shlex.quote(str(launch.log_dir))}")
    try:
        rc = head.process.wait()
    except KeyboardInterrupt:
        launch.say("stopped: ending the Ray cluster")
        return 130
    launch.say(f"the Ray head exited with {rc}")
    return 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return dispatch(args)
    except EnvError as e:  # a variable the launcher reads itself (VERL_PATCHES_DEVICE=NPU): one line, no traceback
        print(f"launch: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C or `launch.cluster.stop` outside the trainer's run (while the nodes join, say): the paths it went
        # through have stopped what they started; this is the last line, not a traceback
        print("launch: stopped by SIGINT (Ctrl-C or launch.cluster.stop)", file=sys.stderr)
        return 130


def environment_refused(settings: ClusterSettings, cluster: bool) -> bool:
    """The registered variables of the launching environment and the env file, parsed as the job parses them
    (`preflight_env`), before anything starts: a value the job would die on is refused, one line each; a typo
    of ours, or a variable the launch replaces, is a note. True when something was refused."""
    # lazy: that module loads omegaconf; importing this one must not
    from verl_patches.launch.preflight import env as preflight_env

    found = preflight_env.variable_findings(preflight_env.seen_variables(settings, os.environ), cluster=cluster)
    for f in found:
        if f.status == "warn":
            print(f"launch: note: {f.message}", flush=True)
    refused = [f.message for f in found if f.status == "fail"]
    if refused:
        print("launch: cannot start:\n  - " + "\n  - ".join(refused), file=sys.stderr)
    return bool(refused)


def dispatch(args: argparse.Namespace) -> int:
    """The dry run, the tiny run or the cluster launch, as ``args`` ask."""
    print(f"launch: {check_package_versions()[0]}", flush=True)  # another image is seen before anything starts
    flags = {s.name: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name) is not None}
    try:
        settings = load_settings(flags, args.env_file)
    except SettingsError as e:
        print(f"launch: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return run_preflight(args, settings)
    if environment_refused(settings, cluster=not args.tiny):
        return 2
    if args.tiny:
        try:
            return run_tiny(args, settings)
        except OSError as e:  # a log folder refused (LogDirError) or not writable
            print(f"launch: {e}", file=sys.stderr)
            return 1
    # lazy: that module loads omegaconf; importing this one must not
    from verl_patches.trainer.config_compose import ConfigCompositionError

    try:
        return run_cluster(args, settings)
    except (SettingsError, NetworkError, ConfigCompositionError, JobLayoutError, OSError) as e:
        print(f"launch: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
