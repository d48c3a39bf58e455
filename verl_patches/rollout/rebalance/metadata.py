"""Request metadata between DP ranks: pickled to uint8 tensors, exchanged with two all_to_all_single
calls (sizes, then payload) over a group; gloo and HCCL both do uneven splits this way (list-form
all_to_all with uneven shapes does not work over gloo)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def pack(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)


def unpack(t: torch.Tensor) -> Any:
    # Only peers of the same job produce these payloads (the rollout's own DP group).
    return pickle.loads(t.numpy().tobytes())  # noqa: S301


def exchange(outgoing: Sequence[Any], group: Any = None) -> list[Any]:
    """outgoing[r] is sent to rank r of `group` (None = nothing); returns what each rank sent here."""

    world = dist.get_world_size(group)
    if len(outgoing) != world:
        raise ValueError(f"need one payload slot per rank of the group ({world}), got {len(outgoing)}")
    payloads = [pack(o) if o is not None else torch.empty(0, dtype=torch.uint8) for o in outgoing]
    send_sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64)
    recv_sizes = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(recv_sizes, send_sizes, group=group)
    recv = torch.empty(int(recv_sizes.sum()), dtype=torch.uint8)
    dist.all_to_all_single(
        recv,
        torch.cat(payloads),
        output_split_sizes=recv_sizes.tolist(),
        input_split_sizes=send_sizes.tolist(),
        group=group,
    )
    out, offset = [], 0
    for n in recv_sizes.tolist():
        out.append(unpack(recv[offset : offset + n]) if n else None)
        offset += n
    return out
