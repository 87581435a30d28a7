"""Fragment pool and fragment-level aggregation of UnlinkableDFL (FragFedAvg, FragKrum).

A node's pool holds its own (local, exact) state and the fragments it received for the
current round, without any sender identity. Aggregation runs range by range over the
common :class:`~privacy.fragments.FragmentLayout`:

* **FragFedAvg**: per-index mean over the values available at that index, the local
  value included. An index no peer covered keeps its local value. With full coverage
  and lossless encoding this is exactly (equal-weight) FedAvg over the node and its
  neighbours.
* **FragKrum**: Krum (Blanchard et al., NeurIPS 2017) applied independently to each
  range: among the ``n_r`` candidates of range ``r`` (local included) it keeps the one
  whose summed squared distance to its ``n_r - B_r - 2`` nearest other candidates is
  smallest. Krum's guarantee needs ``n_r > 2 B_r + 2``; when a range has fewer
  candidates Krum is *not* run: the range falls back to the coordinate-wise median
  (default; robust to ``< n_r / 2`` outliers) or to FragFedAvg, and the event is counted
  in :class:`AggregationStats` (``fallback_ranges``).

Duplicates (the same fragment delivered twice or replayed) are removed by a SHA-256
content hash of (round, range, decoded values); fragments of another round are dropped as stale.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from privacy.fragments import Fragment, FragmentLayout, InvalidFragment, decode
from registry import Registry

KRUM_FALLBACKS = ("median", "fedavg")


@dataclass
class AggregationStats:
    """What one aggregation saw and did (reported per node and round)."""

    ranges: int = 0
    ranges_with_peers: int = 0
    peer_fragments: int = 0
    coverage: float = 0.0  # fraction of indices covered by >= 1 peer fragment
    krum_ranges: int = 0
    fallback_ranges: int = 0  # FragKrum ranges with peers but n_r <= 2 B_r + 2
    duplicates: int = 0
    stale: int = 0
    invalid: int = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class FragmentPool:
    """Local state plus received fragments of one round, grouped by layout range."""

    local: np.ndarray
    layout: FragmentLayout
    round: int
    received: dict[int, list[np.ndarray]] = field(default_factory=dict)
    stats: AggregationStats = field(default_factory=AggregationStats)
    _seen: set[bytes] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.local = np.asarray(self.local, dtype=np.float32)
        if self.local.shape != (self.layout.num_values,):
            raise ValueError(f"local must have shape ({self.layout.num_values},), got {self.local.shape}")

    def add_bytes(self, data: bytes) -> str:
        """Decode and add an encoded fragment; returns 'added', 'duplicate', 'stale' or 'invalid'."""
        try:
            fragment, _ = decode(data)
        except InvalidFragment:
            self.stats.invalid += 1
            return "invalid"
        return self.add(fragment)

    def add(self, fragment: Fragment) -> str:
        """Add a decoded fragment, deduplicated by a content hash of its round, range and values."""
        values = np.asarray(fragment.values, dtype=np.float32)
        digest = hashlib.sha256(f"{fragment.round}/{fragment.start}/".encode() + values.tobytes()).digest()
        if digest in self._seen:
            self.stats.duplicates += 1
            return "duplicate"
        status = self._add(Fragment(fragment.round, fragment.start, values))
        if status == "added":
            self._seen.add(digest)
        return status

    def _add(self, fragment: Fragment) -> str:
        if fragment.round != self.round:
            self.stats.stale += 1
            return "stale"
        index = self.layout.index_of(fragment.start, fragment.stop)
        if index is None:  # not one of the common ranges: cannot be aggregated range-wise
            self.stats.invalid += 1
            return "invalid"
        self.received.setdefault(index, []).append(np.asarray(fragment.values, dtype=np.float32))
        self.stats.peer_fragments += 1
        return "added"

    def candidates(self, index: int) -> np.ndarray:
        """``(n_r, range length)`` candidates of range ``index``: the local slice first."""
        a, b = self.layout.range(index)
        return np.stack([self.local[a:b], *self.received.get(index, [])])

    def _finish_stats(self) -> None:
        covered = sum(b - a for i, (a, b) in enumerate(self.layout.ranges()) if self.received.get(i))
        self.stats.ranges = self.layout.count
        self.stats.ranges_with_peers = sum(1 for i in range(self.layout.count) if self.received.get(i))
        self.stats.coverage = covered / self.layout.num_values


def frag_fedavg(pool: FragmentPool) -> tuple[np.ndarray, AggregationStats]:
    """Per-index mean over local and received values (uncovered indices keep the local value)."""
    out = pool.local.copy()
    for index in pool.received:
        a, b = pool.layout.range(index)
        out[a:b] = pool.candidates(index).astype(np.float64).mean(axis=0)
    pool._finish_stats()
    return out, pool.stats


def krum_select(candidates: np.ndarray, budget: int) -> int:
    """Index of Krum's choice among ``candidates`` (rows) for at most ``budget`` Byzantine rows.

    Requires ``n > 2 budget + 2`` (Blanchard et al. 2017, Prop. 1); raises otherwise.
    """
    n = len(candidates)
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if n <= 2 * budget + 2:
        raise ValueError(f"Krum needs n > 2 B + 2 candidates, got n={n}, B={budget}")
    x = candidates.astype(np.float64)
    sq = (x * x).sum(axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 0.0)
    np.fill_diagonal(d2, np.inf)
    k = n - budget - 2
    scores = np.sort(d2, axis=1)[:, :k].sum(axis=1)
    return int(np.argmin(scores))


def frag_krum(pool: FragmentPool, budget: int = 1, fallback: str = "median") -> tuple[np.ndarray, AggregationStats]:
    """Krum per range with budget ``B_r = budget``; ranges with ``n_r <= 2 B_r + 2`` use ``fallback``."""
    if fallback not in KRUM_FALLBACKS:
        raise ValueError(f"fallback must be one of {KRUM_FALLBACKS}, got {fallback!r}")
    out = pool.local.copy()
    for index in pool.received:
        a, b = pool.layout.range(index)
        cands = pool.candidates(index)
        if len(cands) > 2 * budget + 2:
            out[a:b] = cands[krum_select(cands, budget)]
            pool.stats.krum_ranges += 1
        else:  # honest-majority condition of Krum not met: documented fallback, counted
            pool.stats.fallback_ranges += 1
            agg = np.median if fallback == "median" else np.mean
            out[a:b] = agg(cands.astype(np.float64), axis=0)
    pool._finish_stats()
    return out, pool.stats


Aggregator = Callable[..., tuple[np.ndarray, AggregationStats]]
AGGREGATORS: Registry[Aggregator] = Registry("aggregator")
register_aggregator = AGGREGATORS.register


register_aggregator("fedavg", frag_fedavg)
register_aggregator("krum", frag_krum)
