"""C1: verl's Megatron ``ActorRolloutRefWorker`` on core_r0.8.0 + MindSpeed (A3) and on the CPU emulation.

What changes against verl v0.4.0, and why:

- ``__init__``: upstream opens an nccl group and calls ``mpu.initialize_model_parallel`` with
  ``expert_tensor_parallel_size`` (absent in core_r0.8.0). Here the process group comes from the device
  (hccl on NPU, gloo on the CPU) and Megatron is brought up by ``verl_patches.train_engine``'s
  ``initialize_megatron`` (MindSpeed-LLM's argument parsing + MindSpeed's adaptor, vendor item D1), before
  upstream's ``__init__`` runs, so its own block is skipped. Afterwards the reference's batch sizes and
  offload flag are normalised for the fused ``actor_rollout_ref`` role too (upstream's ``elif`` skips them,
  and ``init_model`` then fails on the missing ``_ref_is_offload_param``), and a stand-alone actor's
  mini-batch is made per data-parallel rank as in the hybrid role.
- ``_build_model_optimizer`` gains ``is_for_actor``: upstream builds the actor only when the role is also a
  rollout and builds nothing at all for a plain ``actor``; the fused role would build the actor twice.
- Weights with ``use_dist_checkpointing`` come from our converter's legacy layout (``legacy_checkpoint``).
- Every batch carries the rollout's sampling temperature, which the actor applies to its logits (C3).
"""

from __future__ import annotations

import functools
import gc
import importlib
from collections.abc import Callable
from typing import Any

import torch

from verl_patches.device import dist_backend, set_local_device
from verl_patches.patches.verl.workers.legacy_checkpoint import load_legacy_weights
from verl_patches.resilience import heartbeat, progress
from verl_patches.train_engine.initialize import initialize_megatron
from verl_patches.train_engine.router_buffers import keep_router_buffers_float32
from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron


def normalize_ref_batch_sizes(ref_config: Any, dp_size: int) -> None:
    """verl's reference normalisation (global micro-batch -> per-rank), for every role that holds a ref."""
    if ref_config.get("log_prob_micro_batch_size", None):
        ref_config.log_prob_micro_batch_size //= dp_size
        ref_config.log_prob_micro_batch_size_per_gpu = ref_config.log_prob_micro_batch_size
    elif ref_config.get("log_prob_micro_batch_size_per_gpu", None) is None:
        raise ValueError("actor_rollout_ref.ref: set log_prob_micro_batch_size_per_gpu (or log_prob_micro_batch_size)")


def trainer_config_view(config: Any) -> Any:
    """The full-trainer-config shape D1's translation reads, from what the worker is given.

    verl hands its Megatron worker only ``actor_rollout_ref``. Everything D1 needs from elsewhere is mirrored
    there by verl's own interpolations: the rollout's ``prompt_length``/``response_length`` are
    ``data.max_*_length``, and before normalisation ``actor.ppo_mini_batch_size`` is the prompts per update
    (our trainer entry requires it to equal ``data.train_batch_size`` for the A3 profiles). The advantage
    estimator is not visible here; the trainer entry refuses anything but grpo before workers start.
    """
    # lazy: OmegaConf is heavy and only this path needs it; importing this module stays light
    from omegaconf import OmegaConf

    if "actor_rollout_ref" in config:
        return config
    return OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "grpo"},
            "data": {
                "train_batch_size": config.actor.ppo_mini_batch_size,
                "max_prompt_length": config.rollout.prompt_length,
                "max_response_length": config.rollout.response_length,
            },
            "actor_rollout_ref": config,
            "trainer": {},
        }
    )


def bring_up(config: Any) -> None:
    """Process group + Megatron/MindSpeed initialisation, once per process."""
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.core import parallel_state as mpu

    if not torch.distributed.is_initialized():
        init_process_group()
    if not mpu.model_parallel_is_initialized():
        initialize_megatron(translate_verl_train_configs_to_megatron(trainer_config_view(config)))
        apply_params_dtype(trainer_config_view(config))


def init_process_group(kind: str | None = None) -> None:
    """The device first, then the group: HCCL binds the current device, and an actor that sees several NPUs
    would otherwise put every rank of its node on device 0."""

    set_local_device(kind)
    torch.distributed.init_process_group(backend=dist_backend(kind))


def apply_params_dtype(config: Any) -> None:
    """``actor.megatron.params_dtype: float32`` (the CPU proof's tiny run): fp32 parameters, set after
    MindSpeed-LLM's argument check, which refuses grouped GEMM without --bf16. Absent or null keeps the
    A3 job's bf16."""
    want = config.actor_rollout_ref.actor.megatron.get("params_dtype", None)
    if want is None:
        return
    if want not in ("float32", "fp32"):
        raise ValueError(f"actor_rollout_ref.actor.megatron.params_dtype must be float32 or null, got {want!r}")
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.training import get_args

    args = get_args()
    args.bf16, args.params_dtype = False, torch.float32


def wrap_init(original: Callable) -> Callable:
    def __init__(self, config: Any, role: str) -> None:
        # hang diagnosis: the bring-up below is collectives (process group, Megatron's groups); publish from here
        heartbeat.start_in_ray_worker()
        progress.enter_call("__init__", None, "init")
        try:
            _init(self, original, config, role)
        finally:
            progress.leave_call()

    return __init__


def _init(self: Any, original: Callable, config: Any, role: str) -> None:
    bring_up(config)
    original(self, config, role)
    if self._is_actor and not self._is_rollout:  # upstream normalises the actor only inside the hybrid role
        # deferred: a patch applies while upstream is still importing; Megatron is read at call time
        from megatron.core import parallel_state as mpu

        self.config.actor.ppo_mini_batch_size *= self.config.rollout.n
        self.config.actor.ppo_mini_batch_size //= mpu.get_data_parallel_world_size()
    if self._is_actor and self._is_ref:  # upstream's elif skipped the reference block for the fused role
        # deferred: a patch applies while upstream is still importing; Megatron is read at call time
        from megatron.core import parallel_state as mpu

        normalize_ref_batch_sizes(self.config.ref, mpu.get_data_parallel_world_size())
        self._ref_is_offload_param = self.config.ref.megatron.get("param_offload", False)


def _build_model_optimizer(
    self,
    model_path: str,
    optim_config: Any,
    override_model_config: dict,
    override_transformer_config: dict,
    is_for_actor: bool = True,
) -> tuple:
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.core.models.gpt.gpt_model import ModelType

    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.megatron.optimizer import get_megatron_optimizer
    from verl.utils.megatron_utils import get_model, init_megatron_optim_config
    from verl.utils.model import get_generation_config, load_megatron_gptmodel_weights

    self._init_hf_config_and_tf_config(
        model_path,
        model_path,
        self.dtype,
        override_model_config,
        override_transformer_config,
        self.config.model.get("trust_remote_code", False),
    )
    self.generation_config = get_generation_config(self.local_path)
    freeze_router = override_model_config.get("moe_config", {}).get("freeze_moe_router", False)

    def provider(pre_process: bool, post_process: bool) -> Any:
        # deferred: a patch applies while upstream is still importing; verl is read at call time
        from verl.models.mcore import init_mcore_model

        model = init_mcore_model(
            self.tf_config,
            self.hf_config,
            pre_process,
            post_process,
            share_embeddings_and_output_weights=self.share_embeddings_and_output_weights,
            value=False,
            freeze_moe_router=freeze_router,
        )
        model.cuda()  # as upstream; the process-wide CUDA->NPU remap places it on the device
        return model

    role_cfg = self.config.actor if is_for_actor else self.config.ref
    if is_for_actor:
        module = get_model(
            provider, wrap_with_ddp=True, use_distributed_optimizer=self.config.actor.megatron.use_distributed_optimizer
        )
    else:
        module = get_model(
            model_provider_func=provider,
            model_type=ModelType.encoder_or_decoder,
            wrap_with_ddp=False,
            use_distributed_optimizer=self.config.ref.megatron.use_distributed_optimizer,
        )
    keep_router_buffers_float32(module)  # before loading, so the checkpoint's float32 router bias lands unrounded
    if role_cfg.load_weight:
        if not is_for_actor and self.config.actor.load_weight != self.config.ref.load_weight:
            raise ValueError("actor.load_weight and ref.load_weight must agree (the reference is the initial actor)")
        if role_cfg.megatron.use_dist_checkpointing:
            if not role_cfg.megatron.get("dist_checkpointing_path", None):
                raise ValueError(
                    f"{'actor' if is_for_actor else 'ref'}.megatron.dist_checkpointing_path is not set (DIST_CKPT_PATH)"
                )
            load_legacy_weights(module, role_cfg.megatron.dist_checkpointing_path, is_value_model=False)
        else:
            load_megatron_gptmodel_weights(
                self.config, self.hf_config, module, params_dtype=self.dtype, is_value_model=False
            )
    if not is_for_actor:
        return module, self.hf_config
    optimizer, optim_cfg = None, None
    if self._is_actor:
        optim_cfg = init_megatron_optim_config(optim_config)
        optimizer = get_megatron_optimizer(model=module, config=optim_cfg)
    return module, optimizer, self.hf_config, optim_cfg


def init_model(self) -> None:
    # lazy: OmegaConf is heavy and only this path needs it; importing this module stays light
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.training import get_args
    from omegaconf import OmegaConf

    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager
    from verl.utils.device import get_torch_device
    from verl.utils.flops_counter import FlopsCounter
    from verl.utils.megatron_utils import offload_megatron_model_to_cpu, offload_megatron_optimizer

    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.workers.actor.megatron_actor import MegatronPPOActor

    if self.config.model.get("external_lib", None) is not None:
        importlib.import_module(self.config.model.external_lib)
    override_model_config = OmegaConf.to_container(self.config.model.get("override_config", OmegaConf.create()))

    def overrides(role_cfg: Any) -> dict:
        return OmegaConf.to_container(
            role_cfg.megatron.get("override_transformer_config", OmegaConf.create()), resolve=True
        )

    # one source of truth for the dtype: the Megatron arguments MindSpeed-LLM builds the model from
    # (bf16 on A3 as in upstream; the CPU golden test also runs fp32)
    self.param_dtype = get_args().params_dtype
    self.dtype = self.param_dtype
    if self._is_actor or self._is_rollout:
        self.actor_module, self.actor_optimizer, self.actor_model_config, self.actor_optim_config = (
            self._build_model_optimizer(
                model_path=self.config.model.path,
                optim_config=self.config.actor.optim if self._is_actor else None,
                override_model_config=override_model_config,
                override_transformer_config=overrides(self.config.actor),
                is_for_actor=True,
            )
        )
        if self._is_offload_param:
            offload_megatron_model_to_cpu(self.actor_module)
        if self._is_offload_optimizer:
            offload_megatron_optimizer(self.actor_optimizer)
    if self._is_actor:
        self.actor = MegatronPPOActor(
            config=self.config.actor,
            model_config=self.actor_model_config,
            hf_config=self.hf_config,
            tf_config=self.tf_config,
            actor_module=self.actor_module,
            actor_optimizer=self.actor_optimizer,
        )
    if self._is_rollout:
        # rollout.trust_remote_code (our key) lets the rollout load remote code the training side does not need
        self.rollout, self.sharding_manager = self._build_rollout(
            trust_remote_code=bool(
                self.config.model.get("trust_remote_code", False) or self.config.rollout.get("trust_remote_code", False)
            )
        )
        self.rollout.sharding_manager = self.sharding_manager
    if self._is_ref:
        self.ref_module, self.ref_model_config = self._build_model_optimizer(
            model_path=self.config.model.path,
            optim_config=None,
            override_model_config=override_model_config,
            override_transformer_config=overrides(self.config.ref),
            is_for_actor=False,
        )
        self.ref_policy = MegatronPPOActor(
            config=self.config.ref,
            model_config=self.ref_model_config,
            hf_config=self.hf_config,
            tf_config=self.tf_config,
            actor_module=self.ref_module,
            actor_optimizer=None,
        )
        if self._ref_is_offload_param:
            offload_megatron_model_to_cpu(self.ref_module)
    if self._is_actor:
        self.flops_counter = FlopsCounter(self.actor_model_config)
        self.checkpoint_mananager = MegatronCheckpointManager(
            config=self.config,
            model_config=self.actor_model_config,
            role="actor",
            model=self.actor_module,
            arch=self.architectures[0],
            hf_config=self.hf_config,
            param_dtype=self.param_dtype,
            share_embeddings_and_output_weights=self.share_embeddings_and_output_weights,
            tokenizer=self.tokenizer,
            optimizer=self.actor_optimizer,
            use_distributed_optimizer=self.config.actor.megatron.use_distributed_optimizer,
            checkpoint_contents=self.config.actor.checkpoint.contents,
        )
    get_torch_device().empty_cache()
    freeze_startup_heap()


def freeze_startup_heap() -> None:
    """Exempt what the worker holds after start-up (modules, models, engines) from every later collection.

    verl's offload helpers and the rollout's sleep call ``gc.collect()`` several times a step, to free device
    memory held by cycles made during the step. Each full collection walks every tracked object of the
    process (about 0.6 M after the imports: 0.5 s of CPU a call); after ``gc.freeze()`` it walks only what was
    made since, and collects the same garbage. The cycles made during start-up are collected here first.
    """
    gc.collect()
    gc.freeze()


def wrap_with_temperature(original: Callable) -> Callable:
    """Every batch the actor trains on says at which temperature the rollout sampled (C3 requires it)."""

    @functools.wraps(original)  # keeps verl's dispatch registration attributes
    def update_actor(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        return original(self, data, *args, **kwargs)

    return update_actor


def wrap_init_model(original: Callable) -> Callable:
    """Our ``init_model`` under upstream's dispatch registration (the decorator's attributes are kept)."""
    return functools.wraps(original)(init_model)
