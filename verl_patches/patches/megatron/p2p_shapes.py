"""D3: the pipeline stages' tensor-shape exchange (variable sequence lengths), each exchange done once.

Megatron core_r0.8.0 always uses batch_isend_irecv followed by an unconditional device synchronize
(slow or hanging on HCCL); MindSpeed's replacement honours batch_p2p_comm but runs the ring exchange
twice when use_ring_exchange_p2p is set. Here: ring exchange once, else batched ops when
config.batch_p2p_comm, else Megatron's ordered send/recv; synchronize only for batch_p2p_comm with
batch_p2p_sync; [0]*tensor_dim for a direction not received.
"""

from __future__ import annotations

from typing import Any

from verl_patches.device import synchronize, torch_device


def communicate_shapes(
    tensor_send_next: Any, tensor_send_prev: Any, recv_prev: bool, recv_next: bool, config: Any, tensor_dim: int = 3
) -> tuple[list[int], list[int]]:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import p2p_communication as p2p

    device = torch_device()

    def empty() -> Any:
        return torch.empty((tensor_dim,), device=device, dtype=torch.int64)

    def shape_of(t: Any) -> Any:
        return torch.tensor(t.size(), device=device, dtype=torch.int64)

    recv_prev_t = empty() if recv_prev else None
    recv_next_t = empty() if recv_next else None
    send_prev_t = shape_of(tensor_send_prev) if tensor_send_prev is not None else None
    send_next_t = shape_of(tensor_send_next) if tensor_send_next is not None else None
    group = parallel_state.get_pipeline_model_parallel_group()
    tensors = dict(
        tensor_send_prev=send_prev_t,
        tensor_recv_prev=recv_prev_t,
        tensor_send_next=send_next_t,
        tensor_recv_next=recv_next_t,
        group=group,
    )
    if getattr(config, "use_ring_exchange_p2p", False):
        torch.distributed.ring_exchange(**tensors)
        reqs: list = []
    elif getattr(config, "batch_p2p_comm", False):
        reqs = p2p._batched_p2p_ops(**tensors)
    else:
        reqs = p2p._p2p_ops(**tensors)
    for req in reqs:
        req.wait()
    if getattr(config, "batch_p2p_comm", False) and getattr(config, "batch_p2p_sync", False):
        synchronize()
    prev = recv_prev_t.tolist() if recv_prev_t is not None else [0] * tensor_dim
    nxt = recv_next_t.tolist() if recv_next_t is not None else [0] * tensor_dim
    return prev, nxt
