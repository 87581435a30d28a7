"""What the simulator records, split by who may see it.

:class:`AdversaryView` is exactly what a passive global network adversary
observes: for every frame put on a link, the send time, the link (from, to),
the size, and the arrival time (``None`` if the frame was lost). It also carries
the public transport parameters, as Kerckhoffs' principle demands. Attacks and
anonymity diagnostics take an ``AdversaryView`` and nothing else.

:class:`GroundTruth` (what each frame really was, which input a relay's output
came from) and :class:`MessageRecord` (who sent what to whom, when it arrived)
are for scoring only: they meet the adversary's guesses inside metric functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


class TraceRecord(NamedTuple):
    time: float
    src: int
    dst: int
    size: int
    arrival: float | None


@dataclass(frozen=True)
class AdversaryView:
    """The passive global adversary's observation plus public parameters."""

    records: tuple[TraceRecord, ...]
    packet_frame_size: int
    mu: float
    fill_timeout: float
    outbox_size: int
    max_path_length: int
    #: The public learning topology (``topology[d]`` = the nodes that send fragments to ``d``),
    #: or None when the adversary is not given it. Public in UnlinkableDFL: neighbours are
    #: announced for learning, so Kerckhoffs' principle puts them in the adversary's hands.
    topology: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.topology is not None:
            topo = tuple(tuple(int(j) for j in row) for row in self.topology)
            object.__setattr__(self, "topology", topo)

    def neighbours(self) -> Sequence[Sequence[int]] | None:
        """The public learning topology, or None (topology-agnostic adversary)."""
        return self.topology

    def packets(self) -> list[TraceRecord]:
        """Frames of Sphinx-packet size (control frames have other sizes)."""
        return [r for r in self.records if r.size == self.packet_frame_size]


class GroundTruthRecord(NamedTuple):
    kind: str  # see stats.TX_KINDS
    in_ref: int | None  # for a relayed packet: index of the frame it came in as
    #: The application message this frame carries: its own id for ``real`` / ``retransmission``
    #: frames and for the ``ack`` of one of its fragments; inherited along ``in_ref`` by relayed
    #: frames; None for cover and control frames.
    message_id: bytes | None = None


@dataclass(frozen=True)
class GroundTruth:
    """Per-frame truth, index-aligned with ``AdversaryView.records``."""

    records: tuple[GroundTruthRecord, ...]


@dataclass
class MessageRecord:
    """Bookkeeping of one ``send`` call (scoring only)."""

    message_id: bytes
    src: int
    dst: int
    size: int
    sent: float
    delivered: float | None = None
    acked: float | None = None
    failed: bool = False
    deliveries: int = 0
