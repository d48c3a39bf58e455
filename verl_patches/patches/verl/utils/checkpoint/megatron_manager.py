"""``MegatronCheckpointManager.save_checkpoint`` / ``load_checkpoint`` on the A3 path.

Upstream v0.4.0 writes one optimizer file name per (pp, tp, dp) with no EP index (EP ranks overwrite each
other), keeps no optimizer step count or param groups, and reads ``torch.cuda`` RNG state; its HF saver for
DeepSeek-V3 raises (vendor item G13). These replacements call `verl_patches.train_engine.actor_state`,
which writes model shards in our converter's layout (exported to HF by ``convert_ckpt_deepseek3.py
--reverse``), the distributed optimizer's DP-gathered state per (tp, pp, ep), and every RNG. Pruning is the
driver's (`trainer_io`); ``max_ckpt_to_keep`` is ignored here. With ``background=True`` the snapshot is taken
here and the files are written by a thread (`verl_patches.checkpoint.background_write`) that the worker's fence
waits for (`verl_patches.driver.checkpoint_fence`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HF_CONFIG_DIR = "hf_config_and_tokenizer"


def _hf_config_dict(hf_config: Any) -> dict | None:
    if hf_config is None:
        return None
    return hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)


def save_checkpoint(
    self: Any,
    local_path: str,
    hdfs_path: str | None = None,
    global_step: int = 0,
    max_ckpt_to_keep: int | None = None,
    background: bool = False,
    own_copy: bool = False,
) -> None:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    # lazy: that module loads numpy, safetensors, torch, tqdm; importing this one must not
    from verl_patches.train_engine.actor_state import snapshot_actor, write_actor

    if hdfs_path is not None:
        raise NotImplementedError("remote (hdfs) checkpoints are not supported by the overlay")
    if "hf_model" in self.checkpoint_contents:
        raise NotImplementedError(
            "actor.checkpoint.contents 'hf_model': export a saved checkpoint with "
            "verl_patches/scripts/convert_ckpt_deepseek3.py --reverse instead"
        )
    snap = snapshot_actor(
        local_path,
        int(global_step),
        self.model,
        self.optimizer if "optimizer" in self.checkpoint_contents else None,
        _hf_config_dict(self.hf_config),
        bool(self.use_distributed_optimizer),
    )
    if torch.distributed.get_rank() == 0 and self.processing_class is not None:
        # the tokenizer and config beside the shards: --tokenizer-dir of the export (kilobytes: written here)
        out = Path(local_path) / HF_CONFIG_DIR
        self.processing_class.save_pretrained(str(out))
        self.hf_config.save_pretrained(str(out))
    if not background:
        write_actor(snap)
        return
    # lazy: the writer thread's module is needed only by a background save
    from verl_patches.checkpoint import background_write

    rank = torch.distributed.get_rank()
    if own_copy:  # the caller frees what the snapshot views right after this returns (the worker's offload)
        snap = snap.owned()
    background_write.start(
        background_write.BackgroundWrite(int(global_step), rank, lambda report: write_actor(snap, report))
    )


def load_checkpoint(
    self: Any, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False
) -> None:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    # lazy: that module loads numpy, safetensors, torch, tqdm; importing this one must not
    from verl_patches.train_engine.actor_state import load_actor

    if local_path is None:
        return
    note = load_actor(
        local_path,
        self.model,
        self.optimizer,
        use_distributed_optimizer=bool(self.use_distributed_optimizer),
        load_optimizer="optimizer" in self.checkpoint_contents,
        load_rng="extra" in self.checkpoint_contents,
    )
    if note and torch.distributed.get_rank() == 0:
        print(f"verl_patches resume: {local_path}: {note}", flush=True)
    # the checkpoint resumed from is never deleted (del_local_after_load is ignored)
