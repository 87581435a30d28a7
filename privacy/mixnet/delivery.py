"""Reliable delivery bookkeeping: fragments awaiting acks, and receiver reassembly.

Sender side: every fragment stays pending until one of its SURBs comes back;
each (re)transmission registers a fresh SURB, so a late ack of an earlier copy
still counts. Receiver side: fragments are stored by (message id, index) and a
message is delivered exactly once, when its last missing fragment arrives;
later copies are acknowledged again (their ack may be the one that gets
through) but never delivered twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class DeliveredMessage:
    """What the receiver's pool gets: no sender identity, by design."""

    message_id: bytes
    data: bytes
    time: float


@dataclass
class PendingFragment:
    dst: int
    message_id: bytes
    index: int
    count: int
    data: bytes
    attempt: int = 0
    #: surb id -> nodes on that attempt's forward and return paths (for blame/absolve)
    surbs: dict[bytes, tuple[int, ...]] = field(default_factory=dict)
    #: the armed ack timer (an environment handle with ``cancel()``)
    timer: Any = None

    @property
    def key(self) -> tuple[bytes, int]:
        return (self.message_id, self.index)


class Reassembler:
    """Receiver-side fragment store with exactly-once delivery.

    Completed message ids are remembered for deduplication; that set grows with
    the number of messages received (16 bytes each), which is the price of
    exactly-once delivery under unbounded retransmission delays.
    """

    def __init__(self) -> None:
        self._partial: dict[bytes, tuple[int, dict[int, bytes]]] = {}
        self._completed: set[bytes] = set()

    def add(self, message_id: bytes, index: int, count: int, data: bytes) -> tuple[str, bytes | None]:
        """Store a fragment.

        Returns
        -------
        ``("complete", data)`` when this fragment completes the message,
        ``("stored", None)`` for a new fragment of an incomplete message,
        ``("duplicate", None)`` for a copy already seen, and
        ``("inconsistent", None)`` when the fragment count disagrees with earlier fragments.
        """
        if message_id in self._completed:
            return "duplicate", None
        expected, parts = self._partial.setdefault(message_id, (count, {}))
        if expected != count:
            return "inconsistent", None
        if index in parts:
            return "duplicate", None
        parts[index] = data
        if len(parts) < count:
            return "stored", None
        del self._partial[message_id]
        self._completed.add(message_id)
        return "complete", b"".join(parts[i] for i in range(count))

    @property
    def partial_messages(self) -> int:
        return len(self._partial)


@dataclass
class OutgoingMessage:
    dst: int
    remaining: int
    failed: bool = False
