"""The launch's check of the checkpoint folder on every node, between "all nodes joined" and "trainer starts".

The dry run sees one host; whether ``CKPT_DIR`` is one storage that every node can write, with room for the
steps kept, only the nodes can say. Once every node's launch has joined the head's Ray cluster, the head runs
`storage_probe`'s three rounds on each of them (`ray_node_calls`) and refuses to start the trainer, in one
line, when the folder is missing on a node, not writable from one, changeable by another account there (the
save's own rule, `checkpoint.root_access`), not the same storage on all, or short of room. With checkpoints
off (``trainer.save_freq`` <= 0) there is nothing to check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_patches.base.env_flags import EnvError
from verl_patches.checkpoint.root_access import allow_shared_root
from verl_patches.launch.cluster.ray_node_calls import cluster_nodes
from verl_patches.launch.cluster.storage_probe import READ_WAIT_S, StorageVerdict, check_folder_on_nodes, run_node_step
from verl_patches.launch.preflight.checkpoint import checkpoint_room, save_freq
from verl_patches.launch.preflight.files import model_findings
from verl_patches.launch.preflight.findings import Context
from verl_patches.launch.preflight.host import probe_host
from verl_patches.launch.preflight.run_costs import human_bytes
from verl_patches.trainer.checkpoint_folder import CKPT_KEY, CKPT_SETTING, folder_problem


def model_config(cfg: Any, settings: Any, root: Path) -> dict[str, Any]:
    """The HF config the step size is computed from: the model folder's, as the preflight reads it."""

    return model_findings(Context(cfg=cfg, settings=settings, root=root, host=probe_host()))[1]


def verdict_on_nodes(
    cfg: Any, model: dict[str, Any], nodes: list[str], call: Callable[..., Any], wait_s: float = READ_WAIT_S
) -> StorageVerdict | None:
    """The folder judged on ``nodes`` through ``call``; None when checkpoints are off."""
    if save_freq(cfg) <= 0:
        return None
    problem = folder_problem(cfg)
    if problem:
        return StorageVerdict(False, problem)
    folder = Path(str(cfg.trainer.default_local_dir))
    need, note = checkpoint_room(cfg, model, folder)
    what = f"{CKPT_SETTING} ({CKPT_KEY})"
    try:
        allow_shared = allow_shared_root()  # the trainer's own reading: the same environment, the same parser
    except EnvError as err:
        return StorageVerdict(False, str(err))
    return check_folder_on_nodes(
        str(folder), nodes, call, need, note, what=what, wait_s=wait_s, human=human_bytes, allow_shared=allow_shared
    )


def check_on_every_node(address: str, cfg: Any, settings: Any, root: Path, say: Callable[[str], None]) -> bool:
    """On the head, with the Ray cluster at ``address`` complete: True to start the trainer. Says one line."""

    if save_freq(cfg) <= 0:
        say(f"checkpoints off (trainer.save_freq={save_freq(cfg)}): no checkpoint folder to check")
        return True
    model = model_config(cfg, settings, root)
    with cluster_nodes(address, run_node_step) as (nodes, call):
        verdict = verdict_on_nodes(cfg, model, nodes, call)
    assert verdict is not None
    say(verdict.message if verdict.ok else f"refused: {verdict.message}")
    return verdict.ok


__all__ = ["check_on_every_node", "model_config", "verdict_on_nodes"]
