"""The fused ActorRolloutRef role (vendor item A1): one worker group is actor, rollout and reference.

Upstream v0.4.0 builds an ``actor_rollout`` group and, for the KL, a second ``ref`` group of the same
worker class on the same pool: two processes per die, the reference model built in the second. With
``overlay.fused_actor_rollout_ref=True`` our `init_workers` builds one ``actor_rollout_ref`` group
(verl's workers accept that role: ``_is_actor``, ``_is_rollout`` and ``_is_ref`` all hold) and makes
``ref_policy_wg`` the same object as ``actor_rollout_wg``. ``Role.RefPolicy`` stays registered, so verl
still computes the KL (``use_reference_policy``); it is just never built as a group of its own.

Worker init order: critic, reward model, then actor/rollout/ref last, so the rollout's KV-cache
estimate sees the memory the others took. Workers receive ``config.actor_rollout_ref`` (upstream's
contract) and ``role="actor_rollout_ref"``.
"""

from __future__ import annotations

from typing import Any

FUSED_PREFIX = "actor_rollout_ref"


def register_fused_role(role_worker_mapping: dict[Any, Any], pool_mapping: dict[Any, str]) -> None:
    """Add Role.ActorRolloutRef (the ActorRollout worker class, on the ActorRollout pool) in place."""
    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.trainer.ppo.ray_trainer import Role

    if Role.ActorRollout not in role_worker_mapping or Role.ActorRollout not in pool_mapping:
        raise ValueError(
            "the fused actor/rollout/ref role needs Role.ActorRollout in the role-worker mapping "
            "and the resource-pool mapping"
        )
    role_worker_mapping.setdefault(Role.ActorRolloutRef, role_worker_mapping[Role.ActorRollout])
    pool_mapping.setdefault(Role.ActorRolloutRef, pool_mapping[Role.ActorRollout])
    if pool_mapping[Role.ActorRolloutRef] != pool_mapping[Role.ActorRollout]:
        raise ValueError(
            f"Role.ActorRolloutRef is mapped to pool {pool_mapping[Role.ActorRolloutRef]!r} but "
            f"Role.ActorRollout to {pool_mapping[Role.ActorRollout]!r}: the fused role needs one pool"
        )


def planned_groups(use_critic: bool, use_rm: bool) -> list[str]:
    """Worker-group prefixes the fused init builds, in init_model order (pure)."""
    return (["critic"] if use_critic else []) + (["rm"] if use_rm else []) + [FUSED_PREFIX]


def init_fused_workers(trainer: Any) -> None:
    # lazy: OmegaConf is heavy and only this path needs it; importing this module stays light
    from omegaconf import OmegaConf

    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.trainer.ppo import ray_trainer as rt

    Role = rt.Role
    if not trainer.hybrid_engine:
        raise ValueError("overlay.fused_actor_rollout_ref=True needs actor_rollout_ref.hybrid_engine=True")
    register_fused_role(trainer.role_worker_mapping, trainer.resource_pool_manager.mapping)
    trainer.resource_pool_manager.create_resource_pool()
    trainer.resource_pool_to_cls = {pool: {} for pool in trainer.resource_pool_manager.resource_pool_dict.values()}

    def add(which: Any, prefix: str, **kwargs: Any) -> None:
        pool = trainer.resource_pool_manager.get_resource_pool(which)
        trainer.resource_pool_to_cls[pool][prefix] = rt.RayClassWithInitArgs(
            cls=trainer.role_worker_mapping[which], **kwargs
        )

    add(Role.ActorRolloutRef, FUSED_PREFIX, config=trainer.config.actor_rollout_ref, role=FUSED_PREFIX)
    if trainer.use_critic:
        add(Role.Critic, "critic", config=trainer.config.critic)
    if trainer.use_rm:
        add(Role.RewardModel, "rm", config=trainer.config.reward_model)

    wg_kwargs = {}
    timeout = OmegaConf.select(trainer.config.trainer, "ray_wait_register_center_timeout")
    if timeout is not None:
        wg_kwargs["ray_wait_register_center_timeout"] = timeout
    all_wg: dict[str, Any] = {}
    for pool, class_dict in trainer.resource_pool_to_cls.items():
        if not class_dict:
            continue
        worker_dict_cls = rt.create_colocated_worker_cls(class_dict=class_dict)
        wg_dict = trainer.ray_worker_group_cls(
            resource_pool=pool, ray_cls_with_init=worker_dict_cls, device_name=trainer.device_name, **wg_kwargs
        )
        all_wg.update(wg_dict.spawn(prefix_set=class_dict.keys()))

    for prefix in planned_groups(trainer.use_critic, trainer.use_rm):
        all_wg[prefix].init_model()
    trainer.critic_wg = all_wg.get("critic")
    trainer.rm_wg = all_wg.get("rm")
    trainer.actor_rollout_wg = all_wg[FUSED_PREFIX]
    if trainer.use_reference_policy:
        trainer.ref_policy_wg = trainer.actor_rollout_wg

    trainer.async_rollout_mode = trainer.config.actor_rollout_ref.rollout.mode == "async"
    if trainer.async_rollout_mode:
        trainer.async_rollout_manager = rt.AsyncLLMServerManager(
            config=trainer.config.actor_rollout_ref, worker_group=trainer.actor_rollout_wg
        )
