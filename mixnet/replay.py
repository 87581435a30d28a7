"""Per-node replay cache with a hard memory bound.

A replayed Sphinx packet reproduces the same shared secret at the node, hence
the same replay tag ``h_tau(s)``. The node keeps the tags it has seen.

Memory strategy (bounded set + rotation): tags live in two generations, each
holding at most ``capacity`` tags. When the current generation is full it
becomes the previous one and the old previous one is discarded. So memory never
exceeds ``2 * capacity`` tags (16 bytes each plus Python set overhead, about
90 bytes per tag in CPython, i.e. ~11.5 MiB per node at the default 65,536),
and a replay is always caught if fewer than ``capacity`` distinct packets
reached the node between the original and the replay. Older replays fall outside
the window; a deployment closes that gap by rotating the node's Sphinx key at
each generation swap (packets for a destroyed key cannot be processed at all).
"""

from __future__ import annotations

DEFAULT_REPLAY_CAPACITY = 65_536


class ReplayCache:
    """Two-generation set of replay tags.

    Parameters
    ----------
    capacity
        Tags per generation; the guaranteed detection window, in packets.
    """

    def __init__(self, capacity: int = DEFAULT_REPLAY_CAPACITY) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self._current: set[bytes] = set()
        self._previous: set[bytes] = set()
        self.rotations = 0

    def seen(self, tag: bytes) -> bool:
        return tag in self._current or tag in self._previous

    def check_and_add(self, tag: bytes) -> bool:
        """Record ``tag``; return True if it was already known (a replay)."""
        if tag in self._current or tag in self._previous:
            return True
        if len(self._current) >= self.capacity:
            self._previous = self._current
            self._current = set()
            self.rotations += 1
        self._current.add(tag)
        return False

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)
