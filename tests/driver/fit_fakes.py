"""The fit loop's fake workers, shared by the tests that run our RayPPOTrainer.fit without Ray or models
(test_fit_loop, test_mismatch_gate, test_run_watch): worker groups that record every DataProto they receive and
answer like verl's workers, verl's tracker replaced by a recorder, and the trainer built around them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, open_dict

from verl_patches.driver.step_plan import StepPlan
from verl_patches.trainer.config_compose import compose_config, resolved
from verl_patches.worker_calls import logprob_mismatch

B, N, P, R, STEPS = 4, 2, 5, 3, 3  # prompts per step, samples per prompt, prompt and response length


@dataclass
class Call:
    method: str
    keys: list[str]
    rows: int
    meta: dict[str, Any]


@dataclass
class FakeWorkerGroup:
    """Records every call; answers like verl's workers (D2D: like the cache-holding workers)."""

    d2d: bool
    skip_old_log_prob: bool
    calls: list[Call] = field(default_factory=list)
    drift: float = 0.01  # train log-prob - rollout log-prob on every response token
    world_size: int = 2

    def _record(self, method: str, data: Any) -> None:
        self.calls.append(Call(method, sorted(data.batch.keys()), len(data), dict(data.meta_info)))

    def generate_sequences(self, data: Any) -> Any:
        from verl import DataProto

        self._record("generate_sequences", data)
        rows = len(data) * N
        prompts = data.batch["input_ids"].repeat_interleave(N, dim=0)
        responses = torch.randint(3, 10, (rows, R))
        mask = torch.ones(rows, P + R, dtype=torch.long)
        mask[0, -1] = 0  # one padded response token
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": mask,
            "rollout_log_probs": -torch.rand(rows, R),
        }
        if not self.d2d:
            tensors["input_ids"] = torch.cat([prompts, responses], dim=1)
            tensors["position_ids"] = torch.arange(P + R).expand(rows, -1).clone()
        self.rollout_lp = tensors["rollout_log_probs"]
        return DataProto.from_dict(tensors)

    def compute_log_prob(self, data: Any) -> Any:
        from verl import DataProto

        self._record("compute_log_prob", data)
        old = data.batch["rollout_log_probs"] + self.drift
        return DataProto.from_dict({"old_log_probs": old, "entropys": torch.ones(len(data), R)})

    def compute_ref_log_prob(self, data: Any) -> Any:
        from tensordict import TensorDict
        from verl import DataProto

        self._record("compute_ref_log_prob", data)
        if self.d2d:  # the workers keep ref_log_prob in their cache
            return DataProto(batch=TensorDict({}, batch_size=[len(data)]))
        return DataProto.from_dict({"ref_log_prob": torch.zeros(len(data), R)})

    def update_actor(self, data: Any) -> Any:
        from verl import DataProto

        self._record("update_actor", data)
        metrics: dict[str, list[float]] = {"actor/pg_loss": [0.5]}
        if self.skip_old_log_prob:  # the actor reports the mismatch from its own forward pass
            metrics[logprob_mismatch.ABS_DIFF] = [self.drift]
        return DataProto(meta_info={"metrics": metrics})

    def methods(self) -> list[str]:
        return [c.method for c in self.calls]


class Recorder:
    logged: list[tuple[int, dict[str, Any]]] = []

    def __init__(self, **_: Any) -> None:
        Recorder.logged = []

    def log(self, data: dict[str, Any], step: int) -> None:
        Recorder.logged.append((step, dict(data)))


class FakePools:
    def get_n_gpus(self) -> int:
        return 2


def reward_fn(data: Any, return_dict: bool = False) -> Any:
    scores = torch.zeros(len(data), R)
    scores[::2, -1] = 1.0
    return {"reward_tensor": scores, "reward_extra_info": {}} if return_dict else scores


def fit_config(logger: str = "console") -> Any:
    """The composed config the fake workers answer for (their batch sizes), with verl's ``trainer.logger``."""
    return resolved(
        compose_config(
            "ppo_mindspeed_trainer",
            [
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.rollout.n=2",
                f"trainer.logger=[{logger}]",
                "trainer.n_gpus_per_node=2",
                "trainer.nnodes=1",
                "algorithm.adv_estimator=grpo",
            ],
        )
    )


def make_trainer(
    base_cfg: Any, monkeypatch: pytest.MonkeyPatch, plan: StepPlan, **cfg_over: Any
) -> tuple[Any, FakeWorkerGroup]:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    cfg = OmegaConf.create(OmegaConf.to_container(base_cfg))
    with open_dict(cfg):
        cfg.trainer.total_training_steps = STEPS
        cfg.trainer.resume_mode = "disable"
        for k, v in cfg_over.items():
            OmegaConf.update(cfg, k, v)
    monkeypatch.setattr("verl.utils.tracking.Tracking", Recorder)
    wg = FakeWorkerGroup(d2d=plan.d2d, skip_old_log_prob=plan.skip_old_log_prob)
    t = object.__new__(RayPPOTrainer)
    ids = torch.randint(3, 10, (B, P))
    batch_dict = {
        "input_ids": ids,
        "attention_mask": torch.ones(B, P, dtype=torch.long),
        "position_ids": torch.arange(P).expand(B, -1).clone(),
        "raw_prompt_ids": np.array([list(r) for r in ids.tolist()], dtype=object),
    }
    t.__dict__.update(
        config=cfg,
        tokenizer=None,
        reward_fn=reward_fn,
        val_reward_fn=None,
        use_rm=False,
        use_critic=False,
        use_reference_policy=True,
        ref_in_actor=False,
        actor_rollout_wg=wg,
        ref_policy_wg=wg,
        async_rollout_mode=False,
        train_dataloader=[batch_dict] * 10,
        total_training_steps=STEPS,
        resource_pool_manager=FakePools(),
        role_worker_mapping={},
        hybrid_engine=True,
    )
    return t, wg
