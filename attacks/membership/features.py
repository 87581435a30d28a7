"""Scalar membership features of a model's softmax output (pure functions).

Each feature maps ``probs`` of shape ``(n, K)`` (rows on the simplex) and the true
``labels`` of shape ``(n,)`` to one score per example. The shadow-model attack
uses each feature separately (seed paper on DP in decentralized FL, Sec. on
membership inference; Shokri et al. 2017), standardized with statistics of the
shadow data only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

#: Added inside logarithms so that a probability of exactly 0 gives a finite value.
LOG_EPS = 1e-12

#: Tolerance on ``|sum_k p_k - 1|`` per row; float32 softmax is far tighter.
SIMPLEX_ATOL = 1e-3

FeatureFn = Callable[[np.ndarray, np.ndarray | None], np.ndarray]


def validate_probs(probs: np.ndarray, name: str = "probs") -> np.ndarray:
    """Return ``probs`` as float64 after checking it is a finite ``(n, K)`` array of distributions.

    Raises
    ------
    ValueError
        Naming ``name`` if the array is not 2-D with K >= 2, has non-finite or
        negative entries, or rows that do not sum to 1 within ``SIMPLEX_ATOL``.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"{name} must have shape (n, K) with K >= 2, got {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name} must be finite")
    if np.any(p < 0):
        raise ValueError(f"{name} must be non-negative (softmax probabilities), got min {p.min()}")
    sums = p.sum(axis=1)
    if p.shape[0] and not np.allclose(sums, 1.0, atol=SIMPLEX_ATOL):
        raise ValueError(f"{name} rows must sum to 1, got sums in [{sums.min()}, {sums.max()}]")
    return p


def validate_labels(labels: np.ndarray, n: int, num_classes: int, name: str = "labels") -> np.ndarray:
    """Return ``labels`` as int64 after checking shape ``(n,)`` and range ``[0, num_classes)``."""
    y = np.asarray(labels)
    if y.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise ValueError(f"{name} must be integer class indices, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"{name} must lie in [0, {num_classes}), got range [{y.min()}, {y.max()}]")
    return y


def confidence(probs: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """Top-class confidence ``max_k p_k(x)``; ``labels`` are ignored."""
    return validate_probs(probs).max(axis=1)


def cross_entropy_loss(probs: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
    """Cross-entropy loss with the true label, ``-log(p_y(x) + LOG_EPS)``.

    ``LOG_EPS`` caps the loss at about 27.6 nats for a zero probability.
    """
    p = validate_probs(probs)
    if labels is None:
        raise ValueError("labels are required for the loss feature, got None")
    y = validate_labels(labels, p.shape[0], p.shape[1])
    return -np.log(p[np.arange(p.shape[0]), y] + LOG_EPS)


def prediction_entropy(probs: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """Shannon entropy of the prediction, ``-sum_k p_k log(p_k + LOG_EPS)``; ``labels`` ignored."""
    p = validate_probs(probs)
    return -np.sum(p * np.log(p + LOG_EPS), axis=1)


def modified_entropy(probs: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
    """Modified prediction entropy with the true label (Song & Mittal 2021, Sec. 3.2, Eq. 5).

    ``Mentr = -(1 - p_y) log p_y - sum_{k != y} p_k log(1 - p_k)``: 0 for a confident
    correct prediction, large for a confident wrong one (plain entropy cannot tell the
    two apart), so members have lower values. ``LOG_EPS`` inside both logarithms.
    """
    p = validate_probs(probs)
    if labels is None:
        raise ValueError("labels are required for the modified-entropy feature, got None")
    y = validate_labels(labels, p.shape[0], p.shape[1])
    idx = np.arange(p.shape[0])
    p_y = p[idx, y]
    others = -p * np.log(np.clip(1.0 - p, 0.0, None) + LOG_EPS)
    others[idx, y] = 0.0
    return -(1.0 - p_y) * np.log(p_y + LOG_EPS) + others.sum(axis=1)


#: Feature registry: name -> function(probs, labels) -> (n,) scores. These are the seed
#: paper's three shadow-attack features; ``modified_entropy`` stays out so that
#: ``run_shadow_mia``'s default rows (and the published dfl-dp tables) do not change.
FEATURES: dict[str, FeatureFn] = {
    "confidence": confidence,
    "loss": cross_entropy_loss,
    "entropy": prediction_entropy,
}


def fit_standardizer(values: np.ndarray, name: str = "values") -> tuple[float, float]:
    """Mean and SD (``ddof=0``) of shadow-data feature values, for :func:`standardize`.

    A zero SD (a constant feature) is replaced by 1 with a warning, so the
    standardized feature is merely centred.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite")
    mean, sd = float(v.mean()), float(v.std())
    if sd == 0.0:
        warnings.warn(f"{name} is constant on the shadow data; standardizing with SD 1", stacklevel=2)
        sd = 1.0
    return mean, sd


def standardize(values: np.ndarray, mean: float, sd: float) -> np.ndarray:
    """``(values - mean) / sd`` with statistics fitted on the shadow data."""
    if not sd > 0:
        raise ValueError(f"sd must be > 0, got {sd}")
    return (np.asarray(values, dtype=np.float64) - mean) / sd
