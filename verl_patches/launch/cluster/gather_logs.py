"""`python -m verl_patches.launch.cluster.gather_logs --env-file cluster.env --run-dir <head run folder> --out DIR`:
every node's logs of one run in one new folder, after a hang or a dead node. From any folder:
`python3 <repo>/verl_patches/launch/cluster/gather_logs.py ...`.

For each node of NODES (the env file; or --nodes), in parallel, the remote shell (ssh by default) runs
`verl_patches.launch.cluster.node_logs` in the repo on that node, which streams the run's files there as a tar: the
launcher's run folders (hang report, trainer.log), Ray's worker logs, the HCCL flight-recorder dumps and CANN's
logs (node_logs says what belongs to a run, and what it refuses to send). They land in ``DIR/<node>/``;
``DIR/gather.json`` says, per node, what came, what was skipped and why. A node that cannot be reached (the
dead one) is named and the others are still gathered.

What a node sends is data: only plain files, under names confined to ``DIR/<node>/`` (no absolute name, no
`..`, no link is ever created), each with its source's permission bits at most (never executable, never
writable by others), within a size budget per node and in all. DIR is created here and must not exist; it and
every folder in it are private (0700), and everything in it is created relative to its descriptor, never by a
path another account could redirect. Each node gets --timeout-s; at the end of it the remote shell and every
process it started (its process group) are killed and reaped, whether or not one of them still holds the pipe.

Exit status: 0 every node gathered; 1 a node failed (named); 2 bad usage.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a file from any folder: the repo on the path, not this folder
    sys.path[0] = str(Path(__file__).resolve().parents[3])

import argparse  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from typing import IO, Any  # noqa: E402

from verl_patches.base.atomic_write import write_json_atomically  # noqa: E402
from verl_patches.base.finite_float import float_arg  # noqa: E402
from verl_patches.base.strict_int import int_arg  # noqa: E402
from verl_patches.launch.cluster.node_logs import MANIFEST  # noqa: E402
from verl_patches.launch.settings import SettingsError, load_settings, node_list, validate_address  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_REMOTE_SHELL = "ssh -o BatchMode=yes -o ConnectTimeout=10"
SUMMARY = "gather.json"
MAX_NAME_PARTS = 32
MAX_MANIFEST_BYTES = 16 << 20  # node_logs lists at most 2000 entries per list: a few MiB at most
MAX_REFUSED = 2000  # refusals listed per node; the rest counted (a stream of a million bad members)
STREAM_SLACK = 64 << 20  # tar headers and the manifest, beyond the files' budget
STDERR_KEEP = 64 << 10  # the end of a remote shell's stderr kept for its error line
AFTER_EXIT_S = 2.0  # how long a pipe may stay open after the remote shell exited (a child holding it)
MAX_HEADER_BYTES = 1 << 20  # a PAX header or GNU long name: a few hundred bytes from node_logs
_HEADER_TYPES = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
_CHUNK = 1 << 20
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NodeStopped(Exception):
    """A node's stream ended early by this side: its time or its byte budget ran out (the message says which)."""


@dataclass
class NodeResult:
    node: str
    files: int = 0
    bytes: int = 0
    refused: list[str] = field(default_factory=list)  # members not written, with why
    refused_more: int = 0  # refusals beyond MAX_REFUSED, counted only
    manifest: dict = field(default_factory=dict)  # what the node says it sent and skipped
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.manifest)

    def refuse(self, name: str, why: str) -> None:
        if len(self.refused) < MAX_REFUSED:
            self.refused.append(f"{printable(name)}: {why}")
        else:
            self.refused_more += 1


class Budget:
    """Bytes all nodes together may still write (--max-total-gib), shared by the nodes' threads."""

    def __init__(self, total: int) -> None:
        self.left, self._lock = total, threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if n > self.left:
                return False
            self.left -= n
            return True


def printable(text: str, limit: int = 300) -> str:
    """`text` from a node as one printable line: controls (newlines, terminal escapes) and bad bytes escaped."""
    out = "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else repr(c)[1:-1] for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


def member_parts(name: str) -> list[str] | None:
    """The path components of a member name, or None when it could leave its folder or is not a plain name."""
    if not name or name.startswith("/") or "\\" in name:
        return None
    if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in name):
        return None
    parts = name.split("/")
    if len(parts) > MAX_NAME_PARTS or any(p in ("", ".", "..") or len(p.encode()) > 255 for p in parts):
        return None
    return parts


def file_mode(sent_mode: Any) -> int:
    """The mode a received file is created with: the source's read and owner-write bits, nothing more."""
    return sent_mode & 0o644 if isinstance(sent_mode, int) and not isinstance(sent_mode, bool) else 0o600


def _open_new_file(node_fd: int, parts: list[str], mode: int) -> tuple[int, int]:
    """Create `parts` below `node_fd`: each folder made here (0700) or already a real folder, the file new.
    Returns (its folder's descriptor, the file's)."""
    fd = os.dup(node_fd)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            inner = os.open(part, _DIR_OPEN, dir_fd=fd)  # a file of that name, or a link: refused
            os.close(fd)
            fd = inner
        return fd, os.open(parts[-1], _NEW_FILE, mode, dir_fd=fd)
    except BaseException:
        os.close(fd)
        raise


def _write_member(src: IO[bytes], folder_fd: int, fd: int, name: str) -> None:
    """Copy a member's data into the new file `fd`; a file the stream broke off in is removed (never left half)."""
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
    except BaseException:
        os.unlink(name, dir_fd=folder_fd)
        raise
    finally:
        os.close(folder_fd)


def read_manifest(data: bytes) -> dict:
    """The node's manifest as data: a JSON object, or a one-line error (ValueError)."""
    if len(data) >= MAX_MANIFEST_BYTES:
        raise ValueError(f"its {MANIFEST} is over {MAX_MANIFEST_BYTES} bytes")
    try:
        value = json.loads(data, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"its {MANIFEST} is not JSON ({printable(str(e), 80)})") from None
    if not isinstance(value, dict):
        raise ValueError(f"its {MANIFEST} is not a JSON object")
    return value


class _BoundedTarInfo(tarfile.TarInfo):
    """A member header whose extended-header or long-name data is read into memory only when small: a node's
    stream cannot make this side hold gigabytes of "header"."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and not 0 <= self.size <= MAX_HEADER_BYTES:
            raise tarfile.ReadError(f"a {self.size}-byte extended header (at most {MAX_HEADER_BYTES})")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def receive(stream: Any, node_fd: int, result: NodeResult, max_bytes: int, total: Budget) -> None:
    """Write the plain files of a node's tar stream below the open (new, empty) folder `node_fd`."""
    with tarfile.open(fileobj=stream, mode="r|", tarinfo=_BoundedTarInfo) as tar:
        for m in tar:
            parts = member_parts(m.name)
            if parts is None:
                result.refuse(repr(m.name), "a name that leaves its folder, or is not printable")
                continue
            if not m.isfile():
                result.refuse(repr(m.name), "not a plain file")
                continue
            src = tar.extractfile(m)
            if src is None:
                result.refuse(repr(m.name), "no data")
                continue
            if m.name == MANIFEST:
                result.manifest = read_manifest(src.read(MAX_MANIFEST_BYTES))
                continue
            if m.size < 0 or result.bytes + m.size > max_bytes or not total.take(m.size):
                result.refuse(repr(m.name), "over the size budget (--max-node-gib, --max-total-gib)")
                continue
            try:
                folder_fd, fd = _open_new_file(node_fd, parts, file_mode(m.mode))
            except OSError as e:
                result.refuse(repr(m.name), f"not written ({e.strerror or e})")
                continue
            _write_member(src, folder_fd, fd, parts[-1])
            result.files += 1
            result.bytes += m.size


class NodePipes(io.RawIOBase):
    """The remote shell's stdout as a stream that never blocks past `deadline` nor reads past `max_bytes`;
    its stderr is drained on the way (the last STDERR_KEEP bytes kept), so neither pipe can stall the other."""

    def __init__(self, proc: subprocess.Popen, deadline: float, max_bytes: int, timeout_s: float) -> None:
        self.deadline, self.max_bytes, self.timeout_s = deadline, max_bytes, timeout_s
        self.out, self.err = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
        self.poller = select.poll()
        self.open = {self.out, self.err}
        for fd in self.open:
            self.poller.register(fd, select.POLLIN)
        self.stderr = bytearray()
        self.got = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        while self.out in self.open:
            data = self.pump(self.deadline, len(buf))
            if data:
                buf[: len(data)] = data
                return len(data)
        return 0

    def pump(self, until: float, size: int = _CHUNK) -> bytes:
        """Wait (until `until` at most) for either pipe; keep what stderr says, return what stdout sent (b""
        when nothing came, or at its end). NodeStopped past the deadline or the byte budget."""
        left = min(until, self.deadline) - time.monotonic()
        if left <= 0 and until >= self.deadline:
            raise NodeStopped(f"timed out after {self.timeout_s:g} s (--timeout-s)")
        ready = [fd for fd, _ in self.poller.poll(max(0.0, min(left, 1.0)) * 1000)]
        if self.err in ready:
            data = os.read(self.err, 65536)
            self.stderr += data
            del self.stderr[:-STDERR_KEEP]
            if not data:
                self._close(self.err)
        if self.out not in ready:
            return b""
        data = os.read(self.out, min(size, _CHUNK))
        if not data:
            self._close(self.out)
        self.got += len(data)
        if self.got > self.max_bytes:
            raise NodeStopped(f"sent more than {self.max_bytes} bytes; stopped")
        return data

    def _close(self, fd: int) -> None:
        self.poller.unregister(fd)
        self.open.discard(fd)


def _has_exited(proc: subprocess.Popen) -> bool:
    """Whether the remote shell has ended, without reaping it: while it is unreaped its pid (and so its process
    group's id) cannot be taken by another process, so the group kill below reaches only what it started."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def finish(proc: subprocess.Popen, pipes: NodePipes, stopped: str) -> tuple[bool, str]:
    """End one node's remote shell: (whether it was still running and had to be killed, why it was stopped).

    Unless already `stopped`, the rest of both pipes is read (and dropped) until they end, or AFTER_EXIT_S after
    the shell exited (a child of it may hold them), within the node's deadline and byte budget, and the shell
    gets until the deadline to exit. Then its process group (the shell and everything it started there) is
    killed, our ends of the pipes closed, and the shell reaped.
    """
    exited_at = None
    while not stopped and pipes.open:
        if exited_at is None and _has_exited(proc):
            exited_at = time.monotonic()
        if exited_at is not None and time.monotonic() > exited_at + AFTER_EXIT_S:
            break
        try:
            pipes.pump(time.monotonic() + 0.2)
        except NodeStopped as e:
            stopped = str(e)
    while not stopped and not _has_exited(proc):
        if time.monotonic() >= pipes.deadline:
            stopped = f"timed out after {pipes.timeout_s:g} s (--timeout-s)"
        time.sleep(0.05)
    killed = not _has_exited(proc)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its session's group: the shell, if still there, and what it left
    except ProcessLookupError:
        pass
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    proc.wait()
    return killed, stopped


def node_command(node: str, args: argparse.Namespace, deadline_s: float) -> list[str]:
    """The remote shell's command line that runs node_logs in the repo on `node` (every word quoted there)."""
    collector = [args.remote_python, "-m", "verl_patches.launch.cluster.node_logs", "--run-dir", args.run_dir]
    collector += ["--window-s", repr(args.window_s), "--max-file-mib", repr(args.max_file_mib)]
    collector += ["--max-node-gib", repr(args.max_node_gib), "--deadline-s", repr(deadline_s)]
    for flag in ("ray_dir", "flight_recorder_prefix", "ascend_log_dir"):
        if getattr(args, flag):
            collector += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    remote = f"cd {shlex.quote(args.repo)} && exec " + " ".join(shlex.quote(w) for w in collector)
    return [*shlex.split(args.remote_shell), node, remote]


def gather_node(node: str, args: argparse.Namespace, out_fd: int, total: Budget, end_by: float) -> NodeResult:
    result = NodeResult(node)
    deadline = min(time.monotonic() + args.timeout_s, end_by)
    if deadline - time.monotonic() < 1:
        result.error = "not started: --total-timeout-s ran out"
        return result
    try:
        os.mkdir(node, 0o700, dir_fd=out_fd)
        node_fd = os.open(node, _DIR_OPEN, dir_fd=out_fd)
    except OSError as e:
        result.error = f"its folder cannot be made ({e.strerror})"
        return result
    max_bytes = int(args.max_node_gib * (1 << 30))
    # node_logs stops sending files a little before this side's deadline, so a slow node still sends its manifest
    remote_deadline = max(1.0, 0.8 * (deadline - time.monotonic()))
    try:
        proc = subprocess.Popen(
            node_command(node, args, remote_deadline),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: ended whole at the time-out
        )
    except OSError as e:
        os.close(node_fd)
        result.error = f"the remote shell does not start ({e.strerror})"
        return result
    pipes = NodePipes(proc, deadline, max_bytes + STREAM_SLACK, args.timeout_s)
    stopped = ""
    try:
        receive(pipes, node_fd, result, max_bytes, total)
    except NodeStopped as e:
        stopped = str(e)
    except (tarfile.TarError, OSError, ValueError, EOFError) as e:
        result.error = f"the stream broke off ({printable(str(e), 200)})"
    except Exception as e:  # noqa: BLE001  (tarfile parsing a hostile stream: one node's fault, never the run's)
        result.error = f"the stream broke off ({type(e).__name__}: {printable(str(e), 200)})"
    finally:
        os.close(node_fd)
        killed, stopped = finish(proc, pipes, stopped)
    said = [ln for ln in pipes.stderr.decode(errors="replace").splitlines() if ln.strip()]
    last = printable(said[-1].strip()) if said else "no message"
    if stopped or killed:
        why = stopped or f"timed out after {args.timeout_s:g} s (--timeout-s)"
        result.error = f"{why}; its remote shell and the processes it started were ended"
    elif proc.returncode != 0:
        result.error = f"exit {proc.returncode}: {last}" + (f"; {result.error}" if result.error else "")
    elif not result.manifest and not result.error:
        result.error = "the node sent no manifest (not node_logs' output?)"
    return result


def _count(manifest: dict, key: str) -> int:
    value = manifest.get(key)
    return len(value) if isinstance(value, (list, dict)) else 0


def describe(r: NodeResult) -> str:
    if r.error:
        return f"node {r.node}: FAILED: {r.error}" + (f" ({r.files} files written before)" if r.files else "")
    parts = r.manifest.get("parts")
    parts = parts if isinstance(parts, dict) else {}
    counts = ", ".join(
        f"{printable(str(k), 40)} {len(v) if isinstance(v, list) else '?'}" for k, v in sorted(parts.items())
    )
    line = f"node {r.node}: {r.files} files, {r.bytes / (1 << 20):.1f} MiB ({counts or 'nothing of this run found'})"
    not_listed = r.manifest.get("not_listed")
    skipped = _count(r.manifest, "skipped") + len(r.refused) + r.refused_more
    skipped += not_listed if isinstance(not_listed, int) and not isinstance(not_listed, bool) else 0
    return line + (f"; {skipped} skipped (see {SUMMARY})" if skipped else "")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.launch.cluster.gather_logs", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--run-dir", required=True, help="the head's run folder, as the launcher printed it")
    p.add_argument("--out", required=True, type=Path, help="a new folder for DIR/<node>/ (an existing one is refused)")
    p.add_argument("--env-file", type=Path, help="cluster.env: NODES, NNODES and WAIT_TIMEOUT_S")
    p.add_argument("--nodes", help="comma-separated nodes (default: NODES of the env file)")
    p.add_argument(
        "--remote-shell", type=remote_shell, default=DEFAULT_REMOTE_SHELL, help="command that runs a command on a node"
    )
    p.add_argument("--remote-python", default=sys.executable, help="the job's Python on the nodes")
    p.add_argument("--repo", default=str(REPO_ROOT), help="the repo on the nodes (the job's working directory)")
    p.add_argument("--window-s", type=float_arg(0, 10**7), default=None, help="default: WAIT_TIMEOUT_S")
    p.add_argument("--ray-dir", default=None)
    p.add_argument("--flight-recorder-prefix", default=None)
    p.add_argument("--ascend-log-dir", default=None)
    p.add_argument("--max-file-mib", type=float_arg(0, 1 << 20), default=256.0)
    p.add_argument("--max-node-gib", type=float_arg(0, 1 << 16), default=16.0)
    p.add_argument("--max-total-gib", type=float_arg(0, 1 << 20), default=256.0, help="all nodes together")
    p.add_argument("--timeout-s", type=float_arg(0, 10**6), default=900.0, help="per node")
    p.add_argument("--total-timeout-s", type=float_arg(0, 10**7), default=3600.0, help="all nodes together")
    p.add_argument("--jobs", type=int_arg(1, 1024), default=16, help="nodes gathered at once")
    return p.parse_args(argv)


def _nodes(args: argparse.Namespace) -> tuple[list[str], Any]:
    flags = {"NODES": args.nodes} if args.nodes else {}
    settings = load_settings(flags, args.env_file)
    if args.nodes and not args.env_file:  # a list on the command line needs no NNODES to agree with
        nodes = [validate_address("--nodes", n.strip(), "flag") for n in args.nodes.split(",")]
        repeated = sorted({n for n in nodes if nodes.count(n) > 1})
        if repeated:
            raise SettingsError(f"--nodes: {', '.join(repeated)} listed more than once")
    else:
        nodes = node_list(settings)
    if SUMMARY in nodes:
        raise SettingsError(f"a node named {SUMMARY} would share its folder with the summary; use its address")
    return nodes, settings


def remote_shell(text: str) -> str:
    """--remote-shell: a command line of at least one word (argparse type)."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a command line ({e})") from None
    if not words:
        raise argparse.ArgumentTypeError("empty")
    return text


def make_out(out: Path) -> int:
    """Create --out new and private, and open it; SettingsError naming it when it exists or is not ours."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SettingsError(f"--out {out}: its parent folder cannot be made ({e.strerror})") from None
    try:
        os.mkdir(out, 0o700)
    except FileExistsError:
        raise SettingsError(f"--out {out} exists; choose a new folder (gather_logs never writes into one)") from None
    except OSError as e:
        raise SettingsError(f"--out {out}: cannot be made ({e.strerror})") from None
    try:
        fd = os.open(out, _DIR_OPEN)
    except OSError as e:
        raise SettingsError(f"--out {out}: replaced while made ({e.strerror}); choose another place") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:  # swapped between the mkdir and the open
        os.close(fd)
        raise SettingsError(f"--out {out}: replaced by another account's folder while made; choose another place")
    return fd


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        nodes, settings = _nodes(args)
        if args.window_s is None:
            args.window_s = float(settings.int("WAIT_TIMEOUT_S"))
        run_dir = Path(args.run_dir)
        args.run_dir = str(run_dir if run_dir.is_absolute() else (REPO_ROOT / run_dir))  # as the launcher makes it
        out_fd = make_out(args.out)
    except SettingsError as e:
        print(f"gather_logs: {e}", file=sys.stderr)
        return 2
    end_by = time.monotonic() + args.total_timeout_s
    total = Budget(int(args.max_total_gib * (1 << 30)))
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(lambda n: gather_node(n, args, out_fd, total, end_by), nodes))
        for r in results:
            print(describe(r), flush=True)
        summary = {"run_dir": args.run_dir, "nodes": [{**asdict(r), "ok": r.ok} for r in results]}
        # through the descriptor: the folder made above, whatever its name points to by now
        write_json_atomically(Path(f"/proc/self/fd/{out_fd}") / SUMMARY, summary)
    finally:
        os.close(out_fd)
    failed = [r.node for r in results if not r.ok]
    print(
        f"gather_logs: {len(results) - len(failed)} of {len(results)} nodes gathered into {args.out}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
