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
        The sender's live peer view (sorted, so a seed fixes the outcome).
    src, dst
        Sender and destination; neither is used as a relay.
    rng
        The sender's seeded generator.

    When the view holds fewer than ``k - 1`` eligible relays, the path is
    shortened to what the view allows (a small network cannot do better).
    """
    probs = path_length_probabilities(max_path_length, weights)
    k = rng.choices(range(1, max_path_length + 1), weights=probs)[0]
    eligible = [c for c in candidates if c != src and c != dst]
    k = min(k, len(eligible) + 1)
    return rng.sample(eligible, k - 1) + [dst]


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
