"""`python -m verl_patches.launch.gather_logs --env-file cluster.env --run-dir <head run folder> --out DIR`: every
node's logs of one run in one folder, after a hang or a dead node.

For each node of NODES (the env file; or --nodes), in parallel, the remote shell (ssh by default) runs
`verl_patches.launch.node_logs` in the repo on that node, which streams the run's files there as a tar: the
launcher's run folders (hang report, trainer.log), Ray's worker logs, the HCCL flight-recorder dumps and CANN's
logs (node_logs says what belongs to a run). They land in ``DIR/<node>/``; ``DIR/gather.json`` says, per node,
what came and what did not. A node that cannot be reached (the dead one) is named and the others are still
gathered. What a node sends is data: only plain files, under names confined to ``DIR/<node>/`` (no absolute
name, no `..`, no link is ever created), within a size budget.

Exit status: 0 every node gathered; 1 a node failed (named); 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import stat
import subprocess
import sys
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from verl_patches.launch.node_logs import MANIFEST
from verl_patches.launch.settings import SettingsError, load_settings, node_list, validate_address

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REMOTE_SHELL = "ssh -o BatchMode=yes -o ConnectTimeout=10"
MAX_NAME_PARTS = 32
_CHUNK = 1 << 20


@dataclass
class NodeResult:
    node: str
    files: int = 0
    bytes: int = 0
    refused: list[str] = field(default_factory=list)  # members not written, with why
    manifest: dict = field(default_factory=dict)  # what the node says it sent and skipped
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.manifest)


def member_parts(name: str) -> list[str] | None:
    """The path components of a member name, or None when it could leave its folder or is not a plain name."""
    if not name or name.startswith("/") or "\\" in name or any(ord(c) < 32 for c in name):
        return None
    parts = name.split("/")
    if len(parts) > MAX_NAME_PARTS or any(p in ("", ".", "..") or len(p) > 255 for p in parts):
        return None
    return parts


def _open_new_file(node_dir: Path, parts: list[str]) -> int:
    """Create `node_dir/parts` for writing: each folder made here or a real folder (never a link), the file new."""
    folder = node_dir
    for part in parts[:-1]:
        folder = folder / part
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                raise OSError(f"{folder} is not a folder") from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.open(folder / parts[-1], flags, 0o644)


def receive(stream: IO[bytes], node_dir: Path, result: NodeResult, max_bytes: int) -> None:
    """Write the plain files of a node's tar stream under `node_dir` (which this call creates, and must be new)."""
    node_dir.mkdir()
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            parts = member_parts(m.name)
            if not m.isfile() or parts is None:
                kind = "not a plain file" if parts is not None else "a name that leaves its folder"
                result.refused.append(f"{m.name!r}: {kind}")
                continue
            if result.bytes + m.size > max_bytes:
                result.refused.append(f"{m.name!r}: over the {max_bytes}-byte budget of a node")
                continue
            src = tar.extractfile(m)
            assert src is not None
            if m.name == MANIFEST:
                result.manifest = json.loads(src.read(1 << 24) or b"{}")
                continue
            try:
                fd = _open_new_file(node_dir, parts)
            except OSError as e:
                result.refused.append(f"{m.name!r}: {e.strerror or e}")
                continue
            with os.fdopen(fd, "wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
            result.files += 1
            result.bytes += m.size


def node_command(node: str, args: argparse.Namespace) -> list[str]:
    """The remote shell's command line that runs node_logs in the repo on `node` (every word quoted there)."""
    collector = [args.remote_python, "-m", "verl_patches.launch.node_logs", "--run-dir", args.run_dir]
    collector += ["--window-s", str(args.window_s), "--max-file-mib", str(args.max_file_mib)]
    collector += ["--max-node-gib", str(args.max_node_gib)]
    for flag in ("ray_dir", "flight_recorder_prefix", "ascend_log_dir"):
        if getattr(args, flag):
            collector += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    remote = f"cd {shlex.quote(args.repo)} && exec " + " ".join(shlex.quote(w) for w in collector)
    return [*shlex.split(args.remote_shell), node, remote]


def gather_node(node: str, args: argparse.Namespace) -> NodeResult:
    result = NodeResult(node)
    proc = subprocess.Popen(node_command(node, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr: list[bytes] = []
    drain = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    drain.start()
    timer = threading.Timer(args.timeout_s, proc.kill)
    timer.start()
    try:
        receive(proc.stdout, Path(args.out) / node, result, int(args.max_node_gib * (1 << 30)))  # type: ignore[arg-type]
    except (tarfile.TarError, OSError, ValueError) as e:
        result.error = f"the stream broke off ({e})"
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
        rc = proc.wait()
        timer.cancel()
        drain.join(5)
    said = b"".join(stderr).decode(errors="replace").strip().splitlines()
    if rc != 0:
        why = "timed out" if rc == -9 else f"exit {rc}"
        result.error = f"{why}: {said[-1] if said else 'no message'}" + (f"; {result.error}" if result.error else "")
    elif not result.manifest and not result.error:
        result.error = "the node sent no manifest (not node_logs' output?)"
    return result


def describe(r: NodeResult) -> str:
    if r.error:
        return f"node {r.node}: FAILED: {r.error}" + (f" ({r.files} files written before)" if r.files else "")
    parts = r.manifest.get("parts", {})
    counts = ", ".join(f"{k} {len(v)}" for k, v in sorted(parts.items())) or "nothing of this run found"
    line = f"node {r.node}: {r.files} files, {r.bytes / (1 << 20):.1f} MiB ({counts})"
    skipped = len(r.manifest.get("skipped", [])) + len(r.refused)
    return line + (f"; {skipped} skipped (see gather.json)" if skipped else "")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m verl_patches.launch.gather_logs", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, help="the head's run folder, as the launcher printed it")
    p.add_argument("--out", required=True, type=Path, help="where DIR/<node>/ go (a node's folder must be new)")
    p.add_argument("--env-file", type=Path, help="cluster.env: NODES, NNODES and WAIT_TIMEOUT_S")
    p.add_argument("--nodes", help="comma-separated nodes (default: NODES of the env file)")
    p.add_argument("--remote-shell", default=DEFAULT_REMOTE_SHELL, help="command that runs a command on a node")
    p.add_argument("--remote-python", default=sys.executable, help="the job's Python on the nodes")
    p.add_argument("--repo", default=str(REPO_ROOT), help="the repo on the nodes (the job's working directory)")
    p.add_argument("--window-s", type=float, default=None, help="default: WAIT_TIMEOUT_S")
    p.add_argument("--ray-dir", default=None)
    p.add_argument("--flight-recorder-prefix", default=None)
    p.add_argument("--ascend-log-dir", default=None)
    p.add_argument("--max-file-mib", type=float, default=256.0)
    p.add_argument("--max-node-gib", type=float, default=16.0)
    p.add_argument("--timeout-s", type=float, default=900.0, help="per node")
    p.add_argument("--jobs", type=int, default=16, help="nodes gathered at once")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        flags = {"NODES": args.nodes} if args.nodes else {}
        settings = load_settings(flags, args.env_file)
        if args.nodes and not args.env_file:  # a list on the command line needs no NNODES to agree with
            nodes = [validate_address("--nodes", n.strip(), "flag") for n in args.nodes.split(",")]
        else:
            nodes = node_list(settings)
        if args.window_s is None:
            args.window_s = float(settings.int("WAIT_TIMEOUT_S"))
    except SettingsError as e:
        print(f"gather_logs: {e}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir)
    args.run_dir = str(run_dir if run_dir.is_absolute() else (REPO_ROOT / run_dir))  # as the launcher makes it
    taken = [n for n in nodes if (args.out / n).exists()]
    if taken:
        print(f"gather_logs: {args.out / taken[0]} exists; choose a new --out", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda n: gather_node(n, args), nodes))
    for r in results:
        print(describe(r), flush=True)
    summary = {"run_dir": args.run_dir, "nodes": [{**asdict(r), "ok": r.ok} for r in results]}
    (args.out / "gather.json").write_text(json.dumps(summary, indent=1) + "\n")
    failed = [r.node for r in results if not r.ok]
    print(
        f"gather_logs: {len(results) - len(failed)} of {len(results)} nodes gathered into {args.out}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
