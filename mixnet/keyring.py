"""A node's Sphinx keys over time: rotation at each replay-cache generation swap.

Why rotate (Sphinx, Danezis & Goldberg 2009, Sec. 5; Nym and Katzenpost rotate
mix keys per epoch): a replay cache of bounded memory forgets old tags, so a
packet replayed after ``capacity`` others would be processed again. If the key
that packet was built for is destroyed by then, it cannot be processed at all.

The schedule, with ``G_i`` the replay-cache generation that starts at swap
``i`` and ``k_i`` the key made at that swap: ``k_i`` is current while ``G_i``
fills, then processes late packets for a grace period, and is destroyed at
the latest at swap ``i + 2``, when ``G_i`` is discarded. Every tag ever made
under ``k_i`` lies in ``G_i`` or ``G_{i+1}``, both kept while ``k_i`` exists:
so a replay is either caught by the cache or unprocessable, whatever its age.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from .constants import PacketFormat
from .errors import InvalidHeader
from .packet import Deliver, Forward, Reply, process_packet
from .replay import ReplayCache


class SphinxKeyring:
    """The current Sphinx key and, for a grace period, the previous one.

    Parameters
    ----------
    key
        The key the node starts with.
    replay_cache
        The node's replay cache; its generation swaps drive :meth:`rotation_due`.
    """

    def __init__(self, key: X25519PrivateKey, replay_cache: ReplayCache) -> None:
        self.current = key
        self.previous: X25519PrivateKey | None = None
        self.previous_until = float("-inf")
        self.replay_cache = replay_cache
        self.generation = 0
        self._swaps_seen = replay_cache.rotations

    def process(self, fmt: PacketFormat, packet: bytes, now: float) -> tuple[Forward | Deliver | Reply, bool]:
        """Peel ``packet`` with the current key, else (in its grace period) the previous one.

        Returns the result and whether the previous key was used. The header MAC
        is checked before the replay tag, so trying the wrong key adds no tag.
        """
        try:
            return process_packet(fmt, self.current, packet, self.replay_cache), False
        except InvalidHeader:
            if self.previous is None or now > self.previous_until:
                self.previous = None  # grace over: destroy it
                raise
        return process_packet(fmt, self.previous, packet, self.replay_cache), True

    def rotation_due(self) -> bool:
        """True once per replay-cache generation swap since the last :meth:`rotate`."""
        return self.replay_cache.rotations != self._swaps_seen

    def rotate(self, new_key: X25519PrivateKey, now: float, grace: float) -> None:
        """Make ``new_key`` current; the old current key serves until ``now + grace``.

        The key it replaces as previous is destroyed here, grace or not: its
        cache generation has just been discarded (see the module docstring).
        """
        self.previous = self.current if grace > 0 else None
        self.previous_until = now + grace
        self.current = new_key
        self.generation += 1
        self._swaps_seen = self.replay_cache.rotations
