"""The fused ActorRolloutRef role (vendor item A1): one worker group on one pool plays actor, rollout and
reference; Role.RefPolicy stays registered (KL) but is never built as a group of its own; critic and reward
model come first, the fused group last; without the switch upstream's init_workers runs unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from verl_patches.driver import fused_role
from verl_patches.patches.verl.trainer.ray_trainer import with_fused_role


class FakeWG:
    def __init__(self, prefix: str, log: list[str]) -> None:
        self.prefix, self.log = prefix, log

    def init_model(self) -> None:
        self.log.append(self.prefix)


class FakeGroupCls:
    built: list[dict[str, Any]] = []
    init_log: list[str] = []

    def __init__(self, resource_pool: Any, ray_cls_with_init: Any, device_name: str, **kw: Any) -> None:
        FakeGroupCls.built.append({"pool": resource_pool, "classes": ray_cls_with_init, "device": device_name})

    def spawn(self, prefix_set: Any) -> dict[str, FakeWG]:
        return {p: FakeWG(p, FakeGroupCls.init_log) for p in prefix_set}


class FakePoolManager:
    def __init__(self, mapping: dict[Any, str]) -> None:
        self.mapping = mapping
        self.resource_pool_dict = {"global_pool": "POOL"}

    def create_resource_pool(self) -> None:
        pass

    def get_resource_pool(self, role: Any) -> str:
        return self.resource_pool_dict[self.mapping[role]]


def make_trainer(monkeypatch: pytest.MonkeyPatch, fused: bool, critic: bool = False) -> Any:
    from verl.trainer.ppo import ray_trainer as rt

    monkeypatch.setattr(rt, "create_colocated_worker_cls", lambda class_dict: dict(class_dict))
    FakeGroupCls.built, FakeGroupCls.init_log = [], []
    Role = rt.Role
    worker, critic_cls = object(), object()
    mapping = {Role.ActorRollout: worker, Role.Critic: critic_cls, Role.RefPolicy: worker}
    pools = {Role.ActorRollout: "global_pool", Role.Critic: "global_pool", Role.RefPolicy: "global_pool"}
    cfg = OmegaConf.create(
        {
            "overlay": {"fused_actor_rollout_ref": fused},
            "actor_rollout_ref": {"rollout": {"mode": "sync"}, "hybrid_engine": True},
            "critic": {"x": 1},
            "reward_model": {},
            "trainer": {},
        }
    )
    t = object.__new__(rt.RayPPOTrainer)
    t.__dict__.update(
        config=cfg,
        role_worker_mapping=mapping,
        resource_pool_manager=FakePoolManager(pools),
        ray_worker_group_cls=FakeGroupCls,
        device_name="cpu",
        hybrid_engine=True,
        use_critic=critic,
        use_rm=False,
        use_reference_policy=True,
    )
    return t


def test_one_group_plays_actor_rollout_and_ref(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.trainer.ppo.ray_trainer import Role

    t = make_trainer(monkeypatch, fused=True)
    upstream = []
    with_fused_role(lambda self: upstream.append(self))(t)
    assert upstream == []
    assert len(FakeGroupCls.built) == 1
    classes = FakeGroupCls.built[0]["classes"]
    assert list(classes) == ["actor_rollout_ref"]
    init = classes["actor_rollout_ref"]
    assert init.cls is t.role_worker_mapping[Role.ActorRollout]
    assert init.kwargs == {"config": t.config.actor_rollout_ref, "role": "actor_rollout_ref"}
    assert t.ref_policy_wg is t.actor_rollout_wg
    assert FakeGroupCls.init_log == ["actor_rollout_ref"]  # built once, not a second time as "ref"
    assert t.resource_pool_manager.mapping[Role.ActorRolloutRef] == "global_pool"
    assert Role.RefPolicy in t.role_worker_mapping  # still registered: verl computes the KL
    assert t.async_rollout_mode is False


def test_critic_is_initialised_before_the_fused_group(monkeypatch: pytest.MonkeyPatch) -> None:
    t = make_trainer(monkeypatch, fused=True, critic=True)
    fused_role.init_fused_workers(t)
    assert sorted(FakeGroupCls.built[0]["classes"]) == ["actor_rollout_ref", "critic"]
    assert FakeGroupCls.init_log == ["critic", "actor_rollout_ref"]
    assert t.critic_wg.prefix == "critic"


def test_without_the_switch_upstream_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    t = make_trainer(monkeypatch, fused=False)
    upstream = []
    with_fused_role(lambda self: upstream.append(self))(t)
    assert upstream == [t] and FakeGroupCls.built == []


def test_planned_groups_order() -> None:
    assert fused_role.planned_groups(False, False) == ["actor_rollout_ref"]
    assert fused_role.planned_groups(True, True) == ["critic", "rm", "actor_rollout_ref"]


def test_register_needs_actor_rollout_on_one_pool() -> None:
    from verl.trainer.ppo.ray_trainer import Role

    with pytest.raises(ValueError, match="Role.ActorRollout"):
        fused_role.register_fused_role({}, {})
    with pytest.raises(ValueError, match="one pool"):
        fused_role.register_fused_role({Role.ActorRollout: 1}, {Role.ActorRollout: "a", Role.ActorRolloutRef: "b"})
