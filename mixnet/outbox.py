"""Fill-and-delay outbox: the mixing step every node applies to what it sends.

Packets (own data, acknowledgements, relayed packets) enter the outbox. When it
holds ``O`` packets, or ``fill_timeout`` after the first packet of a batch
arrived, a batch of up to ``O`` is taken, padded with cover packets to exactly
``O`` (per the cover policy), shuffled, and each packet is released after its
own hold time: the header's delay for a relayed packet, a fresh ``Exp(mu)``
draw for the node's own packets and cover, plus the ``N(0, sigma^2)`` jitter.
An observer of one batch sees ``O`` same-size packets leave at independent
random times: the paper's hidden shuffle worth ``log2 O`` bits (H_relay).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from .routing import jittered


@dataclass(slots=True)
class OutboxItem:
    """One packet waiting in an outbox.

    ``delay`` is the header's hold time for relayed packets and ``None`` for the
    node's own packets (drawn at release). ``ref`` is opaque simulator
    bookkeeping (which incoming transmission a relayed packet came from); it
    never touches the wire.
    """

    next_hop: int
    packet: bytes
    kind: str
    delay: float | None = None
    ref: object = None
    message_id: bytes | None = None  # own data / ack: the message it belongs to (bookkeeping, never on the wire)


class Outbox:
    """FIFO of waiting packets, taken in batches of at most ``size``."""

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        self.size = size
        self._items: list[OutboxItem] = []

    def push(self, item: OutboxItem) -> None:
        self._items.append(item)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        return len(self._items) >= self.size

    def take_batch(self) -> list[OutboxItem]:
        batch, self._items = self._items[: self.size], self._items[self.size :]
        return batch


def mix_batch(
    batch: list[OutboxItem],
    size: int,
    pad: bool,
    make_cover: Callable[[], OutboxItem | None],
    rng: random.Random,
) -> list[OutboxItem]:
    """Pad ``batch`` with cover up to ``size`` (if ``pad``) and shuffle it in place."""
    if pad:
        while len(batch) < size:
            cover = make_cover()
            if cover is None:  # nobody to send cover to (a lone node)
                break
            batch.append(cover)
    rng.shuffle(batch)
    return batch


def release_delays(
    batch: list[OutboxItem], mu: float, sigma: float, rng: random.Random
) -> list[float]:
    """Hold time of each packet of a mixed batch (see module docstring)."""
    out = []
    for item in batch:
        base = item.delay if item.delay is not None else rng.expovariate(1.0 / mu)
        out.append(jittered(base, sigma, rng))
    return out
