"""Model-based attribute inference (Fredrikson et al. 2014; Yeom et al. 2018, Sec. 4).

The adversary knows a record's other features and its label (for the tabular study: the
severity score) but not one sensitive attribute. It tries every candidate value of that
attribute, asks the model, and picks the candidate whose prediction fits the known label
best (lowest loss; ties go to the candidate with the larger prior). The baseline guesses the
prior mode without the model. Attribute inference on *non-members* measures what the model
learned about the population (not a privacy leak of the record); the gap between members
and non-members is what training on the record revealed (Yeom et al.'s attribute advantage).

Threat model: protects nobody by itself; it measures an adversary who holds the final
model (query access suffices), a member's record minus one attribute, and the prior of that
attribute from population data.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _squared(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (pred - y) ** 2


def _cross_entropy(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.clip(pred[np.arange(len(y)), y.astype(np.int64)], 1e-12, 1.0)
    return -np.log(p)


#: Per-example loss of a prediction against the known label: regression and softmax output.
LOSSES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "squared": _squared,
    "cross-entropy": _cross_entropy,
}


def _check(x: np.ndarray, column: int, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xa = np.asarray(x, dtype=np.float64)
    c = np.asarray(candidates, dtype=np.float64)
    if xa.ndim != 2 or xa.shape[0] == 0:
        raise ValueError(f"x must be a non-empty (n, d) array, got shape {xa.shape}")
    if not 0 <= column < xa.shape[1]:
        raise ValueError(f"column must index a feature in [0, {xa.shape[1]}), got {column}")
    if c.ndim != 1 or c.size < 2:
        raise ValueError(f"candidates must be a 1-D array of at least 2 values, got shape {c.shape}")
    return xa, c


def nearest_candidate(values: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Index of the candidate nearest to each value (the true class of a binned attribute)."""
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(candidates, dtype=np.float64)
    return np.argmin(np.abs(v[:, None] - c[None, :]), axis=1)


def infer_attribute(
    predict: Callable[[np.ndarray], np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    column: int,
    candidates: np.ndarray,
    prior: np.ndarray | None = None,
    loss: str = "squared",
) -> np.ndarray:
    """Index of the inferred candidate for each row: the value of ``column`` that fits ``y`` best.

    Parameters
    ----------
    predict : callable
        ``predict(x) -> predictions`` of the attacked model ((n,) for regression, (n, K)
        probabilities for ``loss="cross-entropy"``).
    x : numpy.ndarray
        Records, shape ``(n, d)``; the value in ``column`` is ignored (overwritten).
    y : numpy.ndarray
        The known labels, shape ``(n,)``.
    column : int
        The sensitive attribute's column.
    candidates : numpy.ndarray
        The values to try, in the model's input encoding, shape ``(m,)``.
    prior : numpy.ndarray or None
        Prior probability of each candidate (breaks ties in the loss); ``None`` = uniform.
    loss : str
        A name from :data:`LOSSES`.
    """
    xa, c = _check(x, column, candidates)
    ya = np.asarray(y)
    if ya.shape != (xa.shape[0],):
        raise ValueError(f"y must have shape ({xa.shape[0]},), got {ya.shape}")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {loss!r}")
    pr = np.full(c.size, 1.0 / c.size) if prior is None else np.asarray(prior, dtype=np.float64)
    if pr.shape != c.shape or np.any(pr < 0) or not np.isclose(pr.sum(), 1.0):
        raise ValueError(f"prior must be a distribution over the {c.size} candidates, got {pr}")
    losses = np.empty((xa.shape[0], c.size))
    for j, v in enumerate(c):
        xv = xa.copy()
        xv[:, column] = v
        losses[:, j] = LOSSES[loss](np.asarray(predict(xv), dtype=np.float64), ya)
    # Lexicographic: lowest loss first (rounded so float noise does not beat the prior), then largest prior.
    rounded = np.round(losses, 12)
    best = rounded.min(axis=1, keepdims=True)
    tied = rounded == best
    return np.argmax(np.where(tied, pr[None, :], -1.0), axis=1)


def prior_baseline(true_index_population: np.ndarray, num_candidates: int) -> tuple[int, np.ndarray]:
    """(mode, prior) of the attribute from the adversary's population data (candidate indices)."""
    t = np.asarray(true_index_population, dtype=np.int64)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"population indices must be a non-empty 1-D array, got shape {t.shape}")
    if t.min() < 0 or t.max() >= num_candidates:
        raise ValueError(f"population indices must lie in [0, {num_candidates}), got [{t.min()}, {t.max()}]")
    counts = np.bincount(t, minlength=num_candidates).astype(np.float64)
    return int(np.argmax(counts)), counts / counts.sum()


def attribute_inference_summary(
    predict: Callable[[np.ndarray], np.ndarray],
    members: tuple[np.ndarray, np.ndarray],
    nonmembers: tuple[np.ndarray, np.ndarray],
    population_values: np.ndarray,
    column: int,
    candidates: np.ndarray,
    loss: str = "squared",
) -> dict[str, float | int]:
    """Attack accuracy on members and non-members against the prior-mode baseline.

    ``members`` and ``nonmembers`` are ``(x, y)`` with the true attribute in ``column``;
    ``population_values`` are the attribute's values in the adversary's own data (prior).

    Returns
    -------
    dict
        ``member_accuracy``, ``nonmember_accuracy``, ``baseline_accuracy`` (prior mode on
        the members), ``advantage_over_baseline`` (member - baseline), ``membership_advantage``
        (member - non-member accuracy: what training on the record revealed), ``n_members``,
        ``n_nonmembers``, ``num_candidates``.
    """
    c = np.asarray(candidates, dtype=np.float64)
    mode, prior = prior_baseline(nearest_candidate(population_values, c), c.size)
    acc = {}
    for name, (x, y) in (("member", members), ("nonmember", nonmembers)):
        xa, _ = _check(x, column, c)
        truth = nearest_candidate(xa[:, column], c)
        guess = infer_attribute(predict, xa, y, column, c, prior, loss)
        acc[name] = (float(np.mean(guess == truth)), truth)
    base = float(np.mean(acc["member"][1] == mode))
    return {
        "member_accuracy": acc["member"][0],
        "nonmember_accuracy": acc["nonmember"][0],
        "baseline_accuracy": base,
        "advantage_over_baseline": acc["member"][0] - base,
        "membership_advantage": acc["member"][0] - acc["nonmember"][0],
        "n_members": int(len(acc["member"][1])),
        "n_nonmembers": int(len(acc["nonmember"][1])),
        "num_candidates": int(c.size),
    }
