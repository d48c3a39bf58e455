"""A stand-in for verl's Megatron ``ActorRolloutRefWorker`` with our D2D and call-progress wrappers on its
methods, stacked in the order the catalog applies them on the real class. Its inner methods record what
they receive and answer like upstream's: generate returns this rank's rollout chunk (on the host, as
upstream moves it), ref returns ``ref_log_prob`` from the inputs, update returns metrics."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import OmegaConf

from verl_patches.patches.verl.workers.d2d_cache import (
    wrap_compute_ref_log_prob,
    wrap_generate_sequences,
    wrap_update_actor,
)
from verl_patches.patches.verl.workers.progress_points import with_call_progress

P, R = 3, 2  # prompt and response length
ROLLOUT_KEYS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "rollout_log_probs")


def rollout_chunk(rank: int, rows: int) -> dict[str, torch.Tensor]:
    """What generate leaves on ``rank``: distinct values per rank and row, so a misplaced row shows."""
    g = torch.Generator().manual_seed(1000 + rank)
    prompts = torch.randint(3, 50, (rows, P), generator=g)
    responses = torch.randint(3, 50, (rows, R), generator=g)
    mask = torch.ones(rows, P + R, dtype=torch.long)
    mask[0, -1] = 0
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": mask,
        "position_ids": torch.arange(P + R).expand(rows, -1).clone(),
        "rollout_log_probs": -torch.rand(rows, R, generator=g) - rank,
    }


def ref_log_prob_of(input_ids: torch.Tensor) -> torch.Tensor:
    return -input_ids[:, -R:].double().float() / 100.0


def worker_config(**actor: Any) -> Any:
    return OmegaConf.create({"actor": {"use_kl_loss": True, "recompute_old_log_prob": False, "ppo_epochs": 1, **actor}})


class FakeWorker:
    def __init__(self, rank: int, world_size: int, rows: int, config: Any = None) -> None:
        self.rank, self.world_size, self.rows = rank, world_size, rows
        self.config = config if config is not None else worker_config()
        self._is_actor = self._is_rollout = self._is_ref = True
        self.seen: dict[str, Any] = {}
        self.fail: set[str] = set()

    def _generate(self, prompts: Any) -> Any:
        from verl import DataProto

        self.seen["generate"] = prompts
        return DataProto.from_dict(rollout_chunk(self.rank, self.rows)).to("cpu")

    def _ref(self, data: Any) -> Any:
        from verl import DataProto

        self.seen["ref"] = {k: v.clone() for k, v in data.batch.items()}
        if "ref" in self.fail:
            raise RuntimeError("ref failed")
        return DataProto.from_dict({"ref_log_prob": ref_log_prob_of(data.batch["input_ids"])}).to("cpu")

    def _update(self, data: Any) -> Any:
        from verl import DataProto

        self.seen["update"] = {k: v.clone() for k, v in data.batch.items()}
        self.seen["update_meta"] = dict(data.meta_info)
        if "update" in self.fail:
            raise RuntimeError("update failed")
        return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.0]}})

    generate_sequences = with_call_progress(wrap_generate_sequences(_generate), "generate_sequences")
    compute_ref_log_prob = with_call_progress(wrap_compute_ref_log_prob(_ref), "compute_ref_log_prob")
    update_actor = with_call_progress(wrap_update_actor(_update), "update_actor")
