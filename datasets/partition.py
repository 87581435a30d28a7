"""Client partitioners (registry): IID and Dirichlet label skew.

Data the partition cannot serve (more clients than samples, or ``num_clients * min_size`` above the
number of samples) is a :class:`datasets.base.DataError`: a run stops with that one line, before any
work (flower_apps.router). Arguments out of range (num_clients < 1, alpha <= 0) stay ValueError: the
run keys refuse them first.

Dirichlet at any N. The published construction redraws until every client has ``min_size`` samples.
That loop is kept draw for draw (same generator calls, same acceptance test), so every setting it
served before gets the bit-identical partition. Where it cannot succeed (e.g. alpha = 0.5, 10,000
clients on 50,000 samples: ~90 clients short in every draw) it stops early by a documented rule
(:func:`_hopeless`) and the last draw is repaired (:func:`_repair`), so any N with
``N * min_size <= n`` gets a partition.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from datasets.base import DataError
from registry import Registry, streams

log = logging.getLogger(__name__)

Partitioner = Callable[..., list[np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry("partitioner")
register_partitioner = PARTITIONERS.decorator  # @register_partitioner("name"); duplicate names are refused

#: early-stop level of the redraw loop: stop once, at confidence 1 - HOPELESS, the chance that any
#: remaining draw succeeds is below HOPELESS (so a setting the full loop would serve is served
#: differently with probability ~1e-12 at most, under the model of :func:`_hopeless`)
HOPELESS = 1e-12


def _check(labels: np.ndarray, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > len(labels):
        raise DataError(f"num_clients ({num_clients}) is larger than the number of samples ({len(labels)})")


@register_partitioner("iid")
def iid_partition(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and deal the samples into ``num_clients`` nearly equal parts."""
    _check(labels, num_clients)
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


@dataclass
class DirichletDraw:
    """One draw of the Dirichlet construction, before it is turned into index lists.

    Attributes
    ----------
    perms : class c's sample indices in the drawn order (client k's share is a contiguous run).
    counts : (N, C) samples of class c that client k receives.
    weights : (N, C) ``n_c * q_c[k]``, the (fractional) count the draw meant client k to get.
    """

    perms: list[np.ndarray]
    counts: np.ndarray
    weights: np.ndarray

    def owners(self, num_samples: int) -> np.ndarray:
        """The client of every sample, shape (num_samples,)."""
        owner = np.empty(num_samples, dtype=np.int64)
        clients = np.arange(self.counts.shape[0])
        for c, perm in enumerate(self.perms):
            owner[perm] = np.repeat(clients, self.counts[:, c])
        return owner


def dirichlet_draw(class_idx: list[np.ndarray], conc: np.ndarray, rng: np.random.Generator) -> DirichletDraw:
    """One draw: per class a permutation and proportions ``q_c ~ Dir(conc)``, cut by ``floor(cumsum(q) * n_c)``.

    The generator calls (permutation, then dirichlet, class by class) are those of the published loop,
    so a run's stream is unchanged; only the client sizes are computed here, which is all the
    acceptance test needs (the index lists are built once, for the accepted draw).
    """
    counts = np.empty((len(conc), len(class_idx)), dtype=np.int64)
    weights = np.empty((len(conc), len(class_idx)))
    perms = []
    for c, idx in enumerate(class_idx):
        perm = rng.permutation(idx)
        q = rng.dirichlet(conc)
        n_c = len(idx)
        cuts = (np.cumsum(q) * n_c).astype(int)[:-1]
        # the lengths np.split(perm, cuts) gives: cuts are nondecreasing (cumsum of q >= 0), and a
        # slice bound past the end counts as the end
        counts[:, c] = np.diff(np.clip(np.concatenate(([0], cuts, [n_c])), 0, n_c))
        weights[:, c] = n_c * q
        perms.append(perm)
    return DirichletDraw(perms, counts, weights)


def split_by_owner(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Sorted int64 index list of every client from the client of every sample."""
    order = np.argsort(owner, kind="stable").astype(np.int64)  # stable: ascending indices within a client
    return np.split(order, np.cumsum(np.bincount(owner, minlength=num_clients))[:-1])


def _hopeless(total_short: int, draws: int, remaining: int) -> bool:
    """Whether the redraw loop can stop: no remaining draw will succeed, except with probability < HOPELESS.

    Rule. Let S be the number of clients short of ``min_size`` in a draw (draws are i.i.d.). S is a
    sum of N indicators that are close to independent for large N (they interact only through the
    Dirichlet's normalisation and the shared cut points), so P(S = 0) <= exp(-E[S]) (for independent
    indicators prod(1 - p_k) <= exp(-sum p_k)) and S is about Poisson (measured over 30 draws at
    N = 200-10,000: variance / mean 0.7-1.5, P(S = 0) within sampling error of exp(-mean S)). E[S] is bounded
    below by the exact Poisson lower confidence limit of the observed total (Garwood, 1936):
    ``mu_L = Gamma(total_short, 1).ppf(HOPELESS) / draws``. Stop when
    ``remaining * exp(-mu_L) < HOPELESS``. In numbers (999 draws left): the first draw must have 84
    or more short clients, ten draws 485 in all (48.5 each); over the whole loop the mean must exceed
    about 29. N = 10,000 on 40,000-50,000 samples at alpha 0.5 has 90-210 short per draw and stops at
    the first. Below the rule's line (success unlikely but not hopeless) every draw is made as before:
    a draw costs about 1.4x its numpy dirichlet calls (benchmarks/partition_scale.py), so the worst
    case is ``max_attempts`` such draws (N = 10,000: ~6 s; N = 100,000: ~3 min). Checked by
    tests/datasets/test_partition_scale.py.
    """
    if total_short == 0 or remaining == 0:
        return remaining == 0
    from scipy.special import gammaincinv  # lazy: ~1 s to import, needed only once a draw has failed

    mu_low = float(gammaincinv(total_short, HOPELESS)) / draws
    return math.log(remaining) - mu_low < math.log(HOPELESS)


def _repair(draw: DirichletDraw, owner: np.ndarray, min_size: int) -> tuple[int, int]:
    """Fill every client below ``min_size`` up to exactly ``min_size``; returns (clients filled, samples moved).

    What it does to the distribution, exactly:

    * every sample stays assigned exactly once; class totals are unchanged;
    * a short client k (in index order) keeps its own samples and takes the missing ones from the
      classes the draw weighted highest for it (descending ``n_c * q_c[k]``, ties by class order):
      an emptied client becomes a client of its own top class(es), the mixture its draw intended;
    * the samples of class c come from the donor holding the most class-c samples (ties: lowest
      index) among clients above ``min_size`` (the relative change of that donor's class-c count is
      the smallest possible), the last ones of its drawn run; a donor never drops below ``min_size``;
    * every other client is untouched.

    Feasible whenever ``N * min_size <= n``: total surplus over ``min_size`` >= total deficit.
    """
    counts = draw.counts.copy()
    size = counts.sum(1)
    surplus = np.maximum(size - min_size, 0)
    start = np.cumsum(draw.counts, axis=0) - draw.counts  # where client k's run of class c begins
    num_clients = len(size)
    short = np.flatnonzero(size < min_size)
    prefs = np.argsort(-draw.weights[short], axis=1, kind="stable")
    heaps: dict[int, list[int]] = {}  # class -> max-heap of donors keyed -count * N + client (ties: low index)
    moved = 0
    for k, pref in zip(short.tolist(), prefs.tolist(), strict=True):
        need = min_size - int(size[k])
        for c in pref:
            if need == 0:
                break
            if c not in heaps:
                donors = np.flatnonzero((surplus > 0) & (counts[:, c] > 0))
                heaps[c] = (-counts[donors, c] * num_clients + donors).tolist()
                heapq.heapify(heaps[c])
            heap = heaps[c]
            while need and heap:
                j = heapq.heappop(heap) % num_clients
                if surplus[j] == 0:  # spent on other classes: no longer a donor
                    continue
                t = int(min(need, counts[j, c], surplus[j]))
                end = int(start[j, c] + counts[j, c])
                owner[draw.perms[c][end - t:end]] = k
                counts[j, c] -= t
                surplus[j] -= t
                need -= t
                moved += t
                if counts[j, c] and surplus[j]:
                    heapq.heappush(heap, int(-counts[j, c] * num_clients + j))
        if need:  # cannot happen when N * min_size <= n (checked before any draw)
            raise RuntimeError(f"repair left client {k} {need} samples short")
    return len(short), moved


@register_partitioner("dirichlet")
def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    min_size: int = 1,
    max_attempts: int = 1000,
    prior: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Label-skewed partition: for each class c, proportions q_c ~ Dir(alpha * prior) over clients.

    Standard construction (Hsu et al., 2019; used by the seed paper with alpha = 0.5). Draws are
    repeated (same generator, so reproducible) until every client has at least ``min_size``
    samples, at most ``max_attempts`` times; the loop stops earlier when no remaining draw can
    be expected to succeed (:func:`_hopeless`). If no draw succeeded, the last one is repaired
    (:func:`_repair`: the short clients are filled from their own top classes, taken from the
    largest holders) and a warning says how many samples moved. Every setting the redraw loop
    serves gets the same partition as before this repair existed.

    Raises
    ------
    DataError
        ``num_clients * min_size`` exceeds the number of samples (before any draw).
    """
    _check(labels, num_clients)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    if num_clients * min_size > len(labels):
        raise DataError(f"cannot give {num_clients} clients >= {min_size} samples each from {len(labels)}")
    labels = np.asarray(labels)
    class_idx = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    conc = alpha * (np.ones(num_clients) if prior is None else np.asarray(prior, dtype=float))
    total_short = 0
    for attempt in range(1, max_attempts + 1):
        draw = dirichlet_draw(class_idx, conc, rng)
        short = int((draw.counts.sum(1) < min_size).sum())
        if short == 0:
            return split_by_owner(draw.owners(len(labels)), num_clients)
        total_short += short
        if _hopeless(total_short, attempt, max_attempts - attempt):
            break
    owner = draw.owners(len(labels))
    filled, moved = _repair(draw, owner, min_size)
    log.warning("Dirichlet(alpha=%s): %d draws left clients with < %d samples (%.1f short per draw); repaired "
                "the last: %d clients filled with %d samples (%.3g%% of %d) from the largest holders",
                alpha, attempt, min_size, total_short / attempt, filled, moved, 100 * moved / len(labels),
                len(labels))
    return split_by_owner(owner, num_clients)


def partition(name: str, labels: np.ndarray, num_clients: int, seed: int, **kwargs: object) -> list[np.ndarray]:
    """Run a registered partitioner with a generator derived from ``seed``."""
    if name not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {name!r}; allowed: {sorted(PARTITIONERS)}")
    return PARTITIONERS[name](labels, num_clients, streams.rng("datasets.partition", seed), **kwargs)


def class_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client class counts, shape (num_clients, num_classes)."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def label_skew_tv(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Per non-empty client, the total-variation distance of its label distribution from the global one.

    ``0.5 * sum_c |p_k(c) - p(c)|``: 0 for a client mirroring the data, near 1 for a single-class client
    (a measure of label skew; its mean over clients is what the repair's tests compare).
    """
    counts = class_counts(labels, parts, num_classes)
    sizes = counts.sum(1)
    glob = np.bincount(labels, minlength=num_classes) / len(labels)
    keep = sizes > 0
    return 0.5 * np.abs(counts[keep] / sizes[keep, None] - glob).sum(1)
