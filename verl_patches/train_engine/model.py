"""Build MindSpeed-LLM's DeepSeek-V3 GPTModel (and its optimizer) after `initialize_megatron`.

The exact calls, for verl's Megatron workers or a test:

    args = initialize_megatron(translate_verl_train_configs_to_megatron(config, hf_config))
    model = build_model(args)                      # list of DDP-wrapped model chunks (Megatron get_model)
    optimizer = build_optimizer(model, args)       # Megatron's (distributed) optimizer over MindSpeed's AdamW
    attach_schedule_hooks(model, optimizer, args)  # no_sync / finalize_model_grads for the pipeline schedules
    # or, to plug into verl's own get_model: gpt_model_provider(pre_process, post_process)

The layer spec is the one `--spec` names (MindSpeed-LLM's deepseek_spec: MLA, dense layers then MoE
layers with shared experts and grouped-GEMM routed experts); the transformer config is Megatron's
`core_transformer_config_from_args` as MindSpeed-LLM wraps it (MLA, yarn, router bias, ...).
"""

from __future__ import annotations

import importlib
from typing import Any


def gpt_model_provider(pre_process: bool = True, post_process: bool = True) -> Any:
    """One GPTModel chunk for this rank's pipeline stage, from Megatron's global args."""
    # deferred: importing this module must not load Megatron; it loads once the prelude patched it
    from megatron.core.models.gpt import GPTModel
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    args = get_args()
    config = core_transformer_config_from_args(args)
    if not args.spec:
        raise ValueError("megatron args: --spec (the layer spec module and name) is required for DeepSeek-V3")
    spec = _import_spec(args.spec)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent,
        seq_len_interpolation_factor=args.rotary_seq_len_interpolation_factor,
    )


def _import_spec(spec: list[str]) -> Any:
    module, name = spec
    return getattr(importlib.import_module(module), name)


def build_model(args: Any = None, wrap_with_ddp: bool = True) -> list:
    """Megatron's get_model with the provider above (DDP-wrapped chunks, virtual PP aware)."""
    # deferred: importing this module must not load Megatron; it loads once the prelude patched it
    from megatron.training.training import get_model

    return get_model(gpt_model_provider, wrap_with_ddp=wrap_with_ddp)


def build_optimizer(model: list, args: Any = None) -> Any:
    """Megatron's optimizer for the chunks, configured from the global args (distributed optimizer
    when --use-distributed-optimizer)."""
    # deferred: importing this module must not load Megatron; it loads once the prelude patched it
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.training import get_args

    args = args or get_args()
    kwargs = {}
    for field in OptimizerConfig.__dataclass_fields__:
        if hasattr(args, field):
            kwargs[field] = getattr(args, field)
    return get_megatron_optimizer(OptimizerConfig(**kwargs), model)


def attach_schedule_hooks(model: list, optimizer: Any, args: Any = None) -> Any:
    """What Megatron's train() sets on the model config before running the pipeline schedules: loss
    scaling, no_sync while grads of earlier micro-batches accumulate (overlap_grad_reduce), the grad/param
    sync hooks, and finalize_model_grads. Returns the config. Call once after build_optimizer."""
    # deferred: importing this module must not load Megatron; it loads once the prelude patched it
    from megatron.core.distributed import DistributedDataParallel as DDP
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.utils import get_model_config
    from megatron.training import get_args

    args = args or get_args()
    config = get_model_config(model[0])
    config.grad_scale_func = optimizer.scale_loss
    if isinstance(model[0], DDP) and args.overlap_grad_reduce and config.no_sync_func is None:
        no_sync = [chunk.no_sync for chunk in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        if args.delay_grad_reduce:
            grad_sync = [chunk.start_grad_sync for chunk in model]
            config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    if args.overlap_param_gather and args.delay_param_gather:
        param_sync = [lambda x, i=i: optimizer.finish_param_sync(i, x) for i in range(len(model))]
        config.param_sync_func = param_sync[0] if len(model) == 1 else param_sync
    config.finalize_model_grads_func = finalize_model_grads
    return config
