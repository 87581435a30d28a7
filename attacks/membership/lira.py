"""Offline LiRA: the likelihood-ratio membership test with reference models (Carlini et al. 2022).

"Membership Inference Attacks From First Principles" (S&P 2022), offline variant
(Algorithm 1 without the IN models): the adversary trains ``R`` reference models on random
halves of its own population data, which never contains the candidates, so every reference
model is an OUT model for every candidate. Per candidate it fits a Gaussian to the OUT
statistics and scores the target model's statistic with a one-sided test: a member's
statistic (logit-scaled confidence) is shifted upwards, so the test rejects
"OUT" for large ``Phi((s - mu_out) / sigma_out)``; the score is the standardized statistic
``z = (s - mu_out) / sigma_out`` itself (same ranking, hence same ROC, but no rounding of
``Phi`` to exactly 1 for strong members, which would tie them at low FPR). With few reference
models the per-example variance is noisy; ``fix_variance=True`` uses one variance pooled over
the candidates, as the paper recommends for small numbers of reference models.

Threat model: protects nobody by itself. It measures what an adversary who holds the final
(federated) model, the candidates' records and labels, and disjoint data from the same
population can learn about whether a candidate was in some client's training set. It never
needs the target's training data or any IN model, so "AUC 0.5" here is not an artefact of
shadow models trained on the wrong data.

The module is generic: the caller supplies ``train_reference(pool_indices, seed) -> model``
and ``statistic(model) -> (n,) array`` (the candidates are fixed inside the callable), so
the same code attacks a torch image classifier, a tabular regressor or anything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from attacks.membership.features import LOG_EPS, validate_labels, validate_probs
from attacks.membership.roc import roc_summary
from registry import streams

#: Smallest pooled / per-example SD of the OUT statistics (a constant statistic would divide by 0).
MIN_SD = 1e-6


def logit_confidence(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Logit-scaled confidence of the true class, ``log p_y - log(1 - p_y)`` (Carlini et al. 2022, logit scaling).

    Computed as ``log p_y - log(sum_{k != y} p_k)`` so that a confidence of 1.0 in float64
    stays finite (``LOG_EPS`` in both logarithms).
    """
    p = validate_probs(probs)
    y = validate_labels(labels, p.shape[0], p.shape[1])
    idx = np.arange(p.shape[0])
    p_y = p[idx, y]
    rest = p.sum(axis=1) - p_y
    return np.log(p_y + LOG_EPS) - np.log(np.clip(rest, 0.0, None) + LOG_EPS)


def regression_statistic(predictions: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Membership statistic of a regressor: ``-log(squared error + LOG_EPS)``.

    The regression analogue of the logit scaling: squared errors are heavy-tailed and
    bounded below by 0, their logarithm is close to Gaussian over reference models, and a
    member (fitted more closely) gets a larger value.
    """
    pred = np.asarray(predictions, dtype=np.float64)
    t = np.asarray(targets, dtype=np.float64)
    if pred.ndim != 1 or pred.shape != t.shape:
        raise ValueError(f"predictions and targets must be 1-D of equal length, got {pred.shape} and {t.shape}")
    if not (np.all(np.isfinite(pred)) and np.all(np.isfinite(t))):
        raise ValueError("predictions and targets must be finite")
    return -np.log((pred - t) ** 2 + LOG_EPS)


def lira_offline_scores(target_stat: np.ndarray, out_stats: np.ndarray, fix_variance: bool = True) -> np.ndarray:
    """One-sided offline LiRA scores ``z = (s - mu_out) / sigma_out``; higher means "member".

    ``Phi(z)`` is the test's likelihood of "OUT" being wrong; ``z`` ranks identically.

    Parameters
    ----------
    target_stat : numpy.ndarray
        Statistic of the target model on each candidate, shape ``(n,)``.
    out_stats : numpy.ndarray
        Statistics of ``R >= 2`` OUT reference models, shape ``(R, n)``.
    fix_variance : bool, default True
        One SD pooled over all candidates (mean of the per-candidate variances) instead of
        one per candidate; the paper's choice for few reference models.
    """
    s = np.asarray(target_stat, dtype=np.float64)
    o = np.asarray(out_stats, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"target_stat must be a non-empty 1-D array, got shape {s.shape}")
    if o.ndim != 2 or o.shape[1] != s.size:
        raise ValueError(f"out_stats must have shape (R, {s.size}), got {o.shape}")
    if o.shape[0] < 2:
        raise ValueError(f"out_stats needs at least 2 reference models to fit a variance, got {o.shape[0]}")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(o))):
        raise ValueError("target_stat and out_stats must be finite")
    mu = o.mean(axis=0)
    var = o.var(axis=0, ddof=1)
    sd = np.full_like(mu, np.sqrt(var.mean())) if fix_variance else np.sqrt(var)
    sd = np.maximum(sd, MIN_SD)
    return (s - mu) / sd


def reference_subsets(pool_size: int, num_reference: int, fraction: float, seed: int) -> list[np.ndarray]:
    """``num_reference`` random subsets of ``range(pool_size)``, each ``fraction`` of it (sorted indices)."""
    if num_reference < 2:
        raise ValueError(f"num_reference must be >= 2 (a variance needs two OUT models), got {num_reference}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    size = int(round(pool_size * fraction))
    if size < 1:
        raise ValueError(f"the reference pool ({pool_size} examples x {fraction}) gives empty training sets")
    rngs = [np.random.default_rng(s) for s in streams.spawn("attacks.lira-references", seed, num_reference)]
    return [np.sort(r.choice(pool_size, size=size, replace=False)) for r in rngs]


def run_offline_lira(
    target_model: Any,
    is_member: np.ndarray,
    *,
    statistic: Callable[[Any], np.ndarray],
    train_reference: Callable[[np.ndarray, int], Any],
    pool_size: int,
    num_reference: int = 8,
    fraction: float = 0.5,
    seed: int = 0,
    fix_variance: bool = True,
) -> dict[str, float | int | str]:
    """Offline LiRA against ``target_model``: reference models, Gaussian OUT fit, ROC summary.

    Parameters
    ----------
    target_model : object
        The attacked model, passed to ``statistic`` unchanged.
    is_member : numpy.ndarray
        Ground truth per candidate (1 member, 0 non-member), shape ``(n,)``; used only to
        score the attack, never by it.
    statistic : callable
        ``statistic(model) -> (n,)`` membership statistic of a model on the candidates
        (e.g. :func:`logit_confidence` of its softmax, :func:`regression_statistic`).
    train_reference : callable
        ``train_reference(pool_indices, seed) -> model``: a model of the target's
        architecture and recipe trained on those rows of the adversary's population pool,
        which must be disjoint from the candidates (offline: all reference models are OUT).
    pool_size : int
        Number of rows in the adversary's pool.
    num_reference, fraction, seed, fix_variance
        ``R`` reference models, each on ``fraction`` of the pool, seeded from ``seed``;
        see :func:`lira_offline_scores` for ``fix_variance``.

    Returns
    -------
    dict
        ``attack="lira-offline"``, ``auc``, ``tpr_at_fpr_0.001``, ``tpr_at_fpr_0.01``,
        ``num_reference``, ``n_members``, ``n_nonmembers``, ``seed`` and
        ``reference_seconds`` (wall time of training the reference models: the attack's cost).
    """
    y = np.asarray(is_member)
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    subsets = reference_subsets(pool_size, num_reference, fraction, seed)
    target = np.asarray(statistic(target_model), dtype=np.float64)
    if target.shape != y.shape:
        raise ValueError(f"statistic returned shape {target.shape}, expected one value per candidate {y.shape}")
    t0 = time.perf_counter()
    outs = []
    for i, idx in enumerate(subsets):
        ref = train_reference(idx, seed * 1000 + i)
        outs.append(np.asarray(statistic(ref), dtype=np.float64))
    seconds = time.perf_counter() - t0
    scores = lira_offline_scores(target, np.stack(outs), fix_variance=fix_variance)
    return {
        "attack": "lira-offline",
        **roc_summary(y, scores),
        "num_reference": num_reference,
        "n_members": int(np.sum(y == 1)),
        "n_nonmembers": int(np.sum(y == 0)),
        "seed": seed,
        "reference_seconds": seconds,
    }
