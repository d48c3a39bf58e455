"""One rank of the train-engine proof: the module `run_rank_scripts` runs (test_engine_multiproc.py), argv
OUT_JSON, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and TP, EP, SP set. Starts like a Ray worker (Ray's argv,
prelude first), brings MindSpeed up through initialize_megatron, builds the tiny DeepSeek-V3 GPTModel,
runs forward, backward and a distributed-optimizer step, and writes what it saw as JSON."""

from __future__ import annotations

import json
import os
import sys

sys.argv = [sys.argv[0], "--raylet-name=/tmp/ray/raylet", "--node-ip-address=127.0.0.1", sys.argv[1]]
OUT = sys.argv[-1]
ORIGINAL_ARGV = list(sys.argv)

import verl_patches.prelude_patch  # noqa: E402,F401  (as every Ray worker of ours does first)

# isort: split
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from verl_patches.base.env_flags import env_flag, env_int  # noqa: E402

REAL_COMPILE = torch.compile


def main() -> dict:
    from tests.train_engine.tiny_dsv3 import TINY_HF_CONFIG, VENDOR_SWITCHES, verl_config
    from verl_patches.npu_emulation import builder_ops
    from verl_patches.train_engine.initialize import initialize_megatron
    from verl_patches.train_engine.model import attach_schedule_hooks, build_model, build_optimizer
    from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron

    tp, ep, sp = int(os.environ["TP"]), int(os.environ["EP"]), env_flag("SP")
    pp = env_int("PP", 1)
    layer_list = [int(c) for c in os.environ["LAYERS"].split(",")] if os.environ.get("LAYERS") else None
    dist.init_process_group("gloo")
    cfg = translate_verl_train_configs_to_megatron(
        verl_config(
            tensor_model_parallel_size=tp,
            expert_model_parallel_size=ep,
            sequence_parallel=sp,
            pipeline_model_parallel_size=pp,
            pipeline_parallel_num_layer_list=layer_list,
            fix_router=env_flag("FIX_ROUTER"),
            swap_optimizer=env_flag("SWAP"),
        ),
        TINY_HF_CONFIG,
    )
    args = initialize_megatron(cfg)
    from megatron.core import parallel_state as mpu

    seen = {
        "argv_restored": sys.argv == ORIGINAL_ARGV,
        "compile_is_real": torch.compile is REAL_COMPILE,
        "rank_generator_module": mpu.RankGenerator.get_ranks.__module__,
        "communicate_shapes": __import__(
            "megatron.core.pipeline_parallel.p2p_communication", fromlist=["x"]
        )._communicate_shapes.__module__,
        "tp": mpu.get_tensor_model_parallel_world_size(),
        "pp": mpu.get_pipeline_model_parallel_world_size(),
        "pp_rank": mpu.get_pipeline_model_parallel_rank(),
        "ep": mpu.get_expert_model_parallel_world_size(),
        "dp": mpu.get_data_parallel_world_size(),
        "flags": {
            k: bool(getattr(args, k))
            for k in (*VENDOR_SWITCHES, "multi_head_latent_attention", "use_distributed_optimizer", "sequence_parallel")
        },
    }

    calls: dict[str, int] = {}
    real_ops = builder_ops.emulated_ops

    def counting(name):
        calls["builder:" + name] = calls.get("builder:" + name, 0) + 1
        return real_ops(name)

    builder_ops.emulated_ops = counting
    import torch_npu

    for op in ("npu_rms_norm", "npu_fusion_attention", "npu_swiglu"):
        fn = getattr(torch_npu, op)

        def wrapped(*a, _fn=fn, _op=op, **k):
            calls[_op] = calls.get(_op, 0) + 1
            return _fn(*a, **k)

        setattr(torch_npu, op, wrapped)

    model = build_model(args)
    optimizer = build_optimizer(model, args)
    attach_schedule_hooks(model, optimizer, args)
    seen["optimizers"] = [type(o).__name__ for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    gpt = model[0].module.module  # DDP -> Float16Module -> GPTModel
    layers = gpt.decoder.layers
    seen["layers"] = [type(layer.mlp).__name__ for layer in layers]
    seen["layer_numbers"] = [layer.layer_number for layer in layers]
    if pp > 1:
        seen.update(pipeline_step(model, optimizer, args))
        return seen
    seen["attention"] = type(layers[0].self_attention).__name__
    moe = layers[-1].mlp
    seen["experts"] = type(moe.experts).__name__
    seen["shared_experts"] = moe.shared_experts is not None if hasattr(moe, "shared_experts") else False
    seen["expert_bias"] = getattr(moe.router, "expert_bias", None) is not None
    with torch.no_grad():  # 6 tokens x top-2 through the router of the last MoE layer
        probe = torch.randn(6, 1, TINY_HF_CONFIG["hidden_size"], generator=torch.Generator().manual_seed(0))
        seen["router_indices"] = moe.router.routing(
            moe.router.gating(probe.to(torch.bfloat16)).view(-1, TINY_HF_CONFIG["n_routed_experts"])
        )[1].tolist()

    torch.manual_seed(1)
    tokens = torch.randint(0, TINY_HF_CONFIG["vocab_size"], (2, 16))
    position_ids = torch.arange(16).unsqueeze(0).expand(2, -1)
    mask = torch.ones(2, 1, 16, 16, dtype=torch.bool).triu(1)
    names = [n for n, _ in gpt.named_parameters()]
    before = [p.detach().clone() for p in gpt.parameters()]
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    logits = model[0](tokens, position_ids, mask)
    loss = logits.float().pow(2).mean()
    loss.backward()
    for chunk in model:
        chunk.finish_grad_sync()
    ok, grad_norm, _ = optimizer.step()
    # overlap_param_gather: each rank updated its shard; as in Megatron's loop, zero_grad launches the first
    # all-gather and the next forward's pre-hooks gather the other shards.
    optimizer.zero_grad()
    with torch.no_grad():
        model[0](tokens, position_ids, mask)
    after = list(gpt.parameters())
    seen.update(
        loss=float(loss),
        step_ok=bool(ok),
        grad_norm=float(grad_norm),
        changed=sum(int(not torch.equal(a, b.detach())) for a, b in zip(before, after)),
        unchanged=[n for n, a, b in zip(names, before, after) if torch.equal(a, b.detach())],
        params=len(before),
        logits_shape=list(logits.shape),
        calls=calls,
    )
    return seen


def pipeline_step(model, optimizer, args) -> dict:
    """One training step through Megatron's pipeline schedule (variable sequence lengths: the stages exchange
    shapes first, D3), 2 micro-batches of different lengths."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    torch.manual_seed(2)
    batches = [torch.randint(0, 128, (2, n)) for n in (12, 16)]
    losses = []

    def forward_step(data_iterator, chunk):
        tokens = next(data_iterator)
        n = tokens.shape[1]
        pos = torch.arange(n).unsqueeze(0).expand(2, -1)
        mask = torch.ones(2, 1, n, n, dtype=torch.bool).triu(1)
        out = chunk(tokens, pos, mask)

        def loss_func(output):
            loss = output.float().pow(2).mean()
            losses.append(float(loss))
            return loss, {"loss": loss.detach()}

        return out, loss_func

    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(batches),
        model=model,
        num_microbatches=2,
        seq_length=16,
        micro_batch_size=2,
        forward_only=False,
    )
    ok, grad_norm, _ = optimizer.step()
    return {"pp_losses": losses, "step_ok": bool(ok), "grad_norm": float(grad_norm)}


if __name__ == "__main__":
    result = main()
    with open(OUT, "w") as f:
        json.dump(result, f)
    # no destroy_process_group: the rank ends through exit_rank once this returns (verl_patches.multirank)
