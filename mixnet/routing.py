"""Per-packet route and delay sampling from the sender's own peer view.

A path of ``k`` hops crosses ``k`` links and is processed by ``k`` nodes: the
``k - 1`` relays and the destination. ``k`` follows ``Uniform{1..K}`` by default
(the case of the paper's ``H_path``) or given weights; relays are distinct peers
drawn uniformly without replacement from the live view minus sender and
destination. Every packet, retransmission and SURB return path is sampled
afresh and independently.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Sequence


def path_length_probabilities(max_path_length: int, weights: Sequence[float] | None = None) -> list[float]:
    """``P(k)`` for ``k = 1..K``."""
    if not isinstance(max_path_length, int) or max_path_length < 1:
        raise ValueError(f"max_path_length must be an int >= 1, got {max_path_length!r}")
    if weights is None:
        return [1.0 / max_path_length] * max_path_length
    if len(weights) != max_path_length or sum(weights) <= 0 or min(weights) < 0:
        raise ValueError(f"weights must be {max_path_length} values >= 0 with a positive sum, got {weights!r}")
    total = float(sum(weights))
    return [w / total for w in weights]


def sample_route(
    candidates: Sequence[int],
    src: int,
    dst: int,
    max_path_length: int,
    rng: random.Random,
    weights: Sequence[float] | None = None,
) -> list[int]:
    """Processing nodes of one packet: ``[relay_1, ..., relay_{k-1}, dst]``.

    Parameters
    ----------
    candidates
        The sender's live peer view, sorted ascending (so a seed fixes the outcome, and the relays are found
        by bisection: an unsorted view would let ``src`` or ``dst`` through as a relay).
    src, dst
        Sender and destination; neither is used as a relay.
    rng
        The sender's seeded generator.

    When the view holds fewer than ``k - 1`` eligible relays, the path is
    shortened to what the view allows (a small network cannot do better).
    """
    probs = path_length_probabilities(max_path_length, weights)
    k = rng.choices(range(1, max_path_length + 1), weights=probs)[0]
    eligible = Excluding(candidates, (src, dst))
    k = min(k, len(eligible) + 1)
    return rng.sample(eligible, k - 1) + [dst]


class Excluding(Sequence[int]):
    """A sorted sequence with some values left out, without copying it: ``len`` and indexing in O(log n).

    ``random.sample`` draws indices into its population and copies it only when it is small (at most
    21 items for the path lengths used here), so a route costs O(K log N) instead of the O(N) list of
    eligible relays it used to build for every packet (issue 40); the draws, and so every route of a
    seed, are the same as with that list (tests/mixnet/test_mixnet_routing.py).
    """

    def __init__(self, items: Sequence[int], excluded: Sequence[int]) -> None:
        self._items = items
        # the positions of the excluded values that are present, sorted
        self._gaps = sorted({i for v in set(excluded) if (i := bisect_left(items, v)) < len(items) and items[i] == v})

    def __len__(self) -> int:
        return len(self._items) - len(self._gaps)

    def __getitem__(self, index):  # ints only (random.sample's use)
        if not isinstance(index, int):
            raise TypeError("Excluding supports integer indices only")
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        j = index  # the position in items: skip every gap at or before it
        for gap in self._gaps:
            if gap <= j:
                j += 1
        return self._items[j]


def sample_delays(count: int, mu: float, rng: random.Random) -> list[float]:
    """``count`` hold times ``~ Exp(mean = mu)`` (Loopix's Poisson mixing)."""
    if mu <= 0:
        raise ValueError(f"mu must be > 0, got {mu}")
    return [rng.expovariate(1.0 / mu) for _ in range(count)]


def jittered(delay: float, sigma: float, rng: random.Random) -> float:
    """Add the node-local ``N(0, sigma^2)`` jitter, truncated at zero (see config docs)."""
    if sigma <= 0:
        return delay
    return max(0.0, delay + rng.gauss(0.0, sigma))
