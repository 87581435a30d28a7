"""Client partitioners (registry): IID and Dirichlet label skew.

Data the partition cannot serve (more clients than samples, a skew that leaves a client empty) is a
:class:`datasets.base.DataError`: a run stops with that one line, before any work (flower_apps.router).
Arguments out of range (num_clients < 1, alpha <= 0) stay ValueError: the run keys refuse them first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from datasets.base import DataError
from registry import Registry, streams

Partitioner = Callable[..., list[np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry("partitioner")
register_partitioner = PARTITIONERS.decorator  # @register_partitioner("name"); duplicate names are refused


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

    Standard construction (Hsu et al., 2019; used by the seed paper with alpha = 0.5).
    Draws are repeated (same generator, so reproducible) until every client has at least
    ``min_size`` samples, so that no client is left empty.
    """
    _check(labels, num_clients)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if num_clients * min_size > len(labels):
        raise DataError(f"cannot give {num_clients} clients >= {min_size} samples each from {len(labels)}")
    labels = np.asarray(labels)
    classes = np.unique(labels)
    conc = alpha * (np.ones(num_clients) if prior is None else np.asarray(prior, dtype=float))
    for _ in range(max_attempts):
        buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(conc)
            cuts = (np.cumsum(q) * len(idx)).astype(int)[:-1]
            for k, part in enumerate(np.split(idx, cuts)):
                buckets[k].append(part)
        parts = [np.sort(np.concatenate(b)).astype(np.int64) for b in buckets]
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise DataError(
        f"Dirichlet(alpha={alpha}) left a client with < {min_size} samples in {max_attempts} draws; "
        "use fewer clients, more data or a larger alpha"
    )


def partition(name: str, labels: np.ndarray, num_clients: int, seed: int, **kwargs: object) -> list[np.ndarray]:
    """Run a registered partitioner with a generator derived from ``seed``."""
    if name not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {name!r}; allowed: {sorted(PARTITIONERS)}")
    return PARTITIONERS[name](labels, num_clients, streams.rng("datasets.partition", seed), **kwargs)


def class_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client class counts, shape (num_clients, num_classes)."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
