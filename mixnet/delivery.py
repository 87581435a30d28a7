"""Reliable delivery bookkeeping: fragments awaiting acks, and receiver reassembly.

Sender side: every fragment stays pending until one of its SURBs comes back;
each (re)transmission registers a fresh SURB, so a late ack of an earlier copy
still counts. Receiver side: fragments are stored by (message id, index) and a
message is delivered exactly once, when its last missing fragment arrives;
later copies are acknowledged again (their ack may be the one that gets
through) but never delivered twice.
"""

from __future__ import annotations

from collections import OrderedDict
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
    """Receiver-side fragment store with exactly-once delivery, bounded in entries and time.

    Every input is hostile until checked: a fragment may announce any count up
    to 2^32 and any message id. So at most ``max_messages`` incomplete messages
    are held (a new one evicts the oldest), a message may have at most
    ``max_fragments`` fragments (a larger count is refused), and an incomplete
    message is dropped ``ttl`` seconds after its first fragment arrived.
    Completed ids are remembered for ``ttl`` seconds after completion, to
    deduplicate late copies: a copy arriving later than that (longer than the
    sender's retransmission window, which the default ``ttl`` doubles) would be
    delivered again. Expiry is lazy (checked on each ``add``), so the store
    needs no timers and a simulation's event queue is unchanged.
    """

    def __init__(self, max_messages: int = 64, max_fragments: int = 256, ttl: float = float("inf")) -> None:
        if not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be an int >= 1, got {max_messages!r}")
        if not isinstance(max_fragments, int) or max_fragments < 1:
            raise ValueError(f"max_fragments must be an int >= 1, got {max_fragments!r}")
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl}")
        self.max_messages = max_messages
        self.max_fragments = max_fragments
        self.ttl = ttl
        #: message id -> (first arrival, fragment count, fragments); insertion order = arrival order
        self._partial: OrderedDict[bytes, tuple[float, int, dict[int, bytes]]] = OrderedDict()
        self._completed: OrderedDict[bytes, float] = OrderedDict()  # message id -> completion time
        self.expired = 0
        self.evicted = 0

    def add(self, message_id: bytes, index: int, count: int, data: bytes, now: float = 0.0) -> tuple[str, bytes | None]:
        """Store a fragment that arrived at time ``now``.

        Returns
        -------
        ``("complete", data)`` when this fragment completes the message,
        ``("stored", None)`` for a new fragment of an incomplete message,
        ``("duplicate", None)`` for a copy already seen,
        ``("inconsistent", None)`` when the fragment count disagrees with earlier fragments, and
        ``("oversized", None)`` when ``count`` exceeds ``max_fragments`` (nothing is stored).
        """
        self._expire(now)
        if message_id in self._completed:
            return "duplicate", None
        if count > self.max_fragments:
            return "oversized", None
        entry = self._partial.get(message_id)
        if entry is None:
            while len(self._partial) >= self.max_messages:
                self._partial.popitem(last=False)
                self.evicted += 1
            entry = self._partial[message_id] = (now, count, {})
        _, expected, parts = entry
        if expected != count:
            return "inconsistent", None
        if index in parts:
            return "duplicate", None
        parts[index] = data
        if len(parts) < count:
            return "stored", None
        del self._partial[message_id]
        self._completed[message_id] = now
        return "complete", b"".join(parts[i] for i in range(count))

    def _expire(self, now: float) -> None:
        while self._partial:
            message_id, (first, _, _) = next(iter(self._partial.items()))
            if now - first <= self.ttl:
                break
            del self._partial[message_id]
            self.expired += 1
        while self._completed:
            message_id, done = next(iter(self._completed.items()))
            if now - done <= self.ttl:
                break
            del self._completed[message_id]

    @property
    def partial_messages(self) -> int:
        return len(self._partial)

    @property
    def partial_fragments(self) -> int:
        return sum(len(parts) for _, _, parts in self._partial.values())

    @property
    def completed_ids(self) -> int:
        return len(self._completed)


@dataclass
class OutgoingMessage:
    dst: int
    remaining: int
    failed: bool = False
