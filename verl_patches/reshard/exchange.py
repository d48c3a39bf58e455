"""One rank's part of an all-to-all-v exchange, as plain data (the common output of every planner).

Planners describe data in *units* along dim 0 of a tensor (rows of a batch tensor, whole experts of a
grouped-GEMM weight). A `RankExchange` says, for one rank and one collective call, which unit ranges of
its local source go to which peer and where the units it receives belong. The executor turns it into
``all_to_all_single`` split sizes for whatever process group the caller passes; the cost model reads the
same object, so the bytes it predicts are the bytes the executor moves.

Send staging (`send_staging`): ``all_to_all_single`` takes one contiguous input whose dim-0 splits go to
the group ranks in order. When the ranges sent to successive peers tile one contiguous run of the source,
the input is a zero-copy view of it; otherwise the ranges are packed into a temporary buffer (extra memory
equal to the bytes sent). A rank's own units (peer == rank) normally never enter the collective (the
caller keeps a view of its own data); they are routed through it only when that is what makes the send
side a view, which costs their size once in the receive buffer instead of a larger pack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class Slot:
    """A contiguous run of ``count`` units exchanged with ``peer`` (a global rank).

    For a send slot ``offset`` indexes the sender's source; for a receive slot it indexes the receiver's
    destination (the result's unit index space).
    """

    peer: int
    offset: int
    count: int


class SendStaging(str, Enum):
    VIEW = "view"  # sends to peers tile the source: input is a narrow view
    VIEW_WITH_SELF = "view_with_self"  # tiles only if the self slot is routed through the collective
    PACK = "pack"  # ranges are gathered into a temporary buffer


@dataclass(frozen=True)
class RankExchange:
    """One rank's sends and receives for one collective call (slots sorted by peer, one per peer).

    ``self_slot`` (when not None) is the rank's own contribution to itself: ``peer == rank``, ``offset``
    into the source and ``dst_offset`` into the destination.
    """

    rank: int
    sends: tuple[Slot, ...]
    recvs: tuple[Slot, ...]
    self_src_offset: int | None = None
    self_dst_offset: int | None = None
    self_count: int = 0
    always_route_self: bool = False
    staging: SendStaging = field(init=False)

    def __post_init__(self) -> None:
        for slots in (self.sends, self.recvs):
            peers = [s.peer for s in slots]
            if peers != sorted(set(peers)) or self.rank in peers:
                raise ValueError(f"rank {self.rank}: slots must have distinct peers, sorted, self excluded")
            if any(s.count <= 0 for s in slots):
                raise ValueError(f"rank {self.rank}: empty slots are implicit, not listed")
        if self.has_self and (self.self_src_offset is None or self.self_dst_offset is None):
            raise ValueError(
                f"rank {self.rank}: self_count={self.self_count} needs self_src_offset and self_dst_offset"
            )
        object.__setattr__(self, "staging", self._choose_staging())

    @property
    def has_self(self) -> bool:
        return self.self_count > 0

    def own_slots(self) -> tuple[Slot, Slot]:
        """The rank's own contribution as (send slot into the source, receive slot into the destination);
        only for an exchange that `has_self` (its offsets are then set: `__post_init__`)."""
        src, dst = self.self_src_offset, self.self_dst_offset
        if src is None or dst is None:
            raise ValueError(f"rank {self.rank}: no self slot (self_count={self.self_count})")
        return Slot(self.rank, src, self.self_count), Slot(self.rank, dst, self.self_count)

    def _choose_staging(self) -> SendStaging:
        if self.always_route_self and self.has_self:
            return SendStaging.VIEW_WITH_SELF if _tiles(self._sends_with_self()) else SendStaging.PACK
        if _tiles(self.sends):
            return SendStaging.VIEW
        if self.has_self and _tiles(self._sends_with_self()):
            return SendStaging.VIEW_WITH_SELF
        return SendStaging.PACK

    @property
    def self_in_collective(self) -> bool:
        return self.has_self and (self.always_route_self or self.staging is SendStaging.VIEW_WITH_SELF)

    def _sends_with_self(self) -> tuple[Slot, ...]:
        if not self.has_self:
            return self.sends
        own, _ = self.own_slots()
        return tuple(sorted(self.sends + (own,), key=lambda s: s.peer))

    def collective_sends(self) -> tuple[Slot, ...]:
        """Send slots as they enter the collective (self included when routed through it)."""
        return self._sends_with_self() if self.self_in_collective else self.sends

    def collective_recvs(self) -> tuple[Slot, ...]:
        if not self.self_in_collective:
            return self.recvs
        _, own = self.own_slots()
        return tuple(sorted(self.recvs + (own,), key=lambda s: s.peer))

    @property
    def units_sent(self) -> int:
        """Units sent to other ranks (what crosses the interconnect)."""
        return sum(s.count for s in self.sends)

    @property
    def units_received(self) -> int:
        return sum(s.count for s in self.recvs)

    @property
    def staging_units(self) -> int:
        """Units of a temporary send buffer (zero when the input is a view)."""
        return sum(s.count for s in self.collective_sends()) if self.staging is SendStaging.PACK else 0

    @property
    def receive_buffer_units(self) -> int:
        return sum(s.count for s in self.collective_recvs())

    @property
    def is_idle(self) -> bool:
        return not self.sends and not self.recvs and not self.self_in_collective


def _tiles(slots: Sequence[Slot]) -> bool:
    """True when the slots (in peer order) cover one contiguous run of the source without overlap."""
    for prev, cur in zip(slots, slots[1:]):
        if cur.offset != prev.offset + prev.count:
            return False
    return True
