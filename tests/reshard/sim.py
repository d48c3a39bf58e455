"""In-process stand-ins for the collectives, so plans over 256 ranks can be checked on real tensors."""

from __future__ import annotations

import torch

from verl_patches.reshard.exchange import RankExchange


def simulate_all_to_all(exchanges: list[RankExchange], sources: list[torch.Tensor]) -> list[torch.Tensor]:
    """What ``all_to_all_single`` on the world group would leave in every rank's receive buffer."""
    sent = {}
    for ex in exchanges:
        for s in ex.collective_sends():
            sent[(ex.rank, s.peer)] = sources[ex.rank].narrow(0, s.offset, s.count)
    outputs = []
    for ex in exchanges:
        parts = []
        for s in ex.collective_recvs():
            piece = sent.pop((s.peer, ex.rank))
            assert piece.shape[0] == s.count, (ex.rank, s)
            parts.append(piece)
        trailing = sources[ex.rank].shape[1:]
        outputs.append(torch.cat(parts) if parts else sources[ex.rank].new_empty((0, *trailing)))
    assert not sent, f"sent but never received: {sorted(sent)}"
    return outputs
