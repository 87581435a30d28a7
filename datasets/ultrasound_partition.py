"""Ultrasound-study partitions: label skew Dir(alpha * p), log-normal quantity skew, client validation.

Label skew (ultrasound study, Sec. "Data partitioning"): client k's class mixture is
pi_k ~ Dirichlet(alpha * p) with p the global class distribution (alpha = 0.5). Quantity
skew: client sizes n_k from a log-normal, rescaled to the total. Both margins cannot hold
exactly for arbitrary draws (a class has only so many images), so the count matrix is the
iterative-proportional-fitting (Sinkhorn) projection of diag(n) pi onto the margins
(rows: client sizes, columns: class totals). IPF keeps every client's *relative* class
odds, so the skew pattern of the Dirichlet draw survives while every image is used once.
Feature skew is not a partition: see :func:`datasets.transforms.scanner_profiles`.

Registered in :mod:`datasets.partition` as ``label-quantity-skew``.
"""

from __future__ import annotations

import numpy as np

from datasets.partition import register_partitioner
from datasets.splits import _largest_remainder


def lognormal_sizes(total: int, num_clients: int, rng: np.random.Generator, sigma: float = 0.5,
                    min_size: int = 1) -> np.ndarray:
    """Client sizes: ``min_size`` each plus a log-normal(0, sigma) share of the rest; sums to ``total``."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if num_clients * min_size > total:
        raise ValueError(f"cannot give {num_clients} clients >= {min_size} samples each from {total}")
    w = rng.lognormal(0.0, sigma, num_clients) if sigma > 0 else np.ones(num_clients)
    return min_size + _largest_remainder(total - num_clients * min_size, w / w.sum())


def ipf_counts(pi: np.ndarray, row_targets: np.ndarray, col_totals: np.ndarray, iters: int = 500,
               tol: float = 1e-9) -> np.ndarray:
    """Integer (K, C) counts with column sums exactly ``col_totals`` and row sums close to ``row_targets``.

    Sinkhorn scaling of ``row_targets[:, None] * pi`` to both margins, then each column is
    rounded by largest remainder (rows then match their targets up to about C samples).
    """
    pi = np.asarray(pi, dtype=float)
    rows = np.asarray(row_targets, dtype=float)
    cols = np.asarray(col_totals, dtype=float)
    if pi.shape != (len(rows), len(cols)):
        raise ValueError(f"pi has shape {pi.shape}, expected ({len(rows)}, {len(cols)})")
    if not np.isclose(rows.sum(), cols.sum()):
        raise ValueError(f"row targets sum to {rows.sum()} but column totals to {cols.sum()}")
    m = np.maximum(pi, 1e-12) * rows[:, None]
    for _ in range(iters):
        m *= (cols / m.sum(0))[None, :]
        m *= (rows / m.sum(1))[:, None]
        if np.abs(m.sum(0) - cols).max() < tol * max(cols.max(), 1):
            break
    out = np.zeros(m.shape, dtype=np.int64)
    for c in range(m.shape[1]):
        out[:, c] = _largest_remainder(int(cols[c]), m[:, c] / m[:, c].sum()) if cols[c] > 0 else 0
    return out


@register_partitioner("label-quantity-skew")
def label_quantity_skew_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    sigma: float = 0.5,
    label_skew: bool = True,
    quantity_skew: bool = True,
    min_size: int = 1,
    max_attempts: int = 100,
) -> list[np.ndarray]:
    """Indices per client under label skew Dir(alpha * p) and/or log-normal quantity skew.

    With neither skew it is a stratified equal split. Draws repeat (same generator, so
    reproducible) until every client has at least ``min_size`` samples.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if num_clients < 1 or num_clients * min_size > n:
        raise ValueError(f"cannot give {num_clients} clients >= {min_size} samples each from {n}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    classes, col = np.unique(labels, return_counts=True)
    p = col / n
    for _ in range(max_attempts):
        sizes = (lognormal_sizes(n, num_clients, rng, sigma, min_size) if quantity_skew
                 else _largest_remainder(n, np.full(num_clients, 1 / num_clients)))
        pi = rng.dirichlet(alpha * p, size=num_clients) if label_skew else np.tile(p, (num_clients, 1))
        counts = ipf_counts(pi, sizes, col)
        if counts.sum(1).min() >= min_size:
            break
    else:
        raise RuntimeError(f"no draw gave every client >= {min_size} samples in {max_attempts} attempts; "
                           "use fewer clients or a larger alpha")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for j, c in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        for k, part in enumerate(np.split(idx, np.cumsum(counts[:, j])[:-1])):
            parts[k].append(part)
    return [np.sort(np.concatenate(p_)).astype(np.int64) for p_ in parts]


def client_validation_sets(val_pool: np.ndarray, train_sizes: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Disjoint client validation sets drawn from the global pool, sizes proportional to the clients' train sizes."""
    train_sizes = np.asarray(train_sizes, dtype=float)
    if (train_sizes < 0).any() or train_sizes.sum() <= 0:
        raise ValueError(f"train sizes must be >= 0 with a positive sum, got {train_sizes}")
    sizes = _largest_remainder(len(val_pool), train_sizes / train_sizes.sum())
    order = rng.permutation(np.asarray(val_pool))
    return [np.sort(p) for p in np.split(order, np.cumsum(sizes)[:-1])]


def partition_table(labels: np.ndarray, parts: list[np.ndarray], class_names: tuple[str, ...]) -> list[dict]:
    """Rows like the paper's Table 2: client, size, share of the total and class % per client."""
    labels = np.asarray(labels)
    total = sum(len(p) for p in parts)
    rows = []
    for k, p in enumerate(parts):
        counts = np.bincount(labels[p], minlength=len(class_names))
        row = {"client": k, "size": int(len(p)), "share (%)": round(100 * len(p) / max(total, 1), 1)}
        for name, c in zip(class_names, counts):
            row[f"{name} (%)"] = round(float(100 * c / max(len(p), 1)), 1)
        rows.append(row)
    return rows
