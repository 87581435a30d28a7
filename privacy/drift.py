"""Client-drift detection from model divergence (paper, Section V).

After a local training round every client holds weights w_i. The pairwise divergence is

    d_ij = ||w_i - w_j||_F / (0.5 (||w_i||_F + ||w_j||_F))          (paper, Sec. V)

(norms over all parameters seen as one vector). The paper reads Figure 1 by eye; here the
rule is explicit: each client's typical divergence is its median divergence to the others,
m_i = median_{j != i} d_ij (robust to one or two drifted peers), and a client is flagged when
its modified z-score (Iglewicz & Hoaglin 1993)

    z_i = 0.6745 (m_i - median(m)) / MAD(m),   MAD(m) = median |m - median(m)|

exceeds a threshold (3.5, their recommendation) AND m_i is at least ``min_ratio`` (1.25)
times the cohort's median of m. The test is one-sided: only clients *further* from the rest
are suspicious. The ratio guard is an effect-size floor: when honest clients are nearly
interchangeable, MAD is tiny and the z-score alone flags about 1.4% of honest clients
(measured on synthetic i.i.d. cohorts of 10; 10% of clean runs would raise an alarm), although
no honest client sits more than ~10% above the median in the study's runs (drifted ones sit
70-190% above). When MAD = 0 (more than half the clients tie),
the mean absolute deviation times 1.2533 (its ratio to the SD under normality, as for
MAD's 1.4826) replaces it; when that is 0 too, nobody is flagged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MAD_TO_Z = 0.6745  # Phi^-1(0.75): makes MAD consistent with the SD of a normal sample
MEANAD_TO_SD = 1.2533  # sqrt(pi / 2): mean absolute deviation -> SD of a normal sample
DEFAULT_THRESHOLD = 3.5
DEFAULT_MIN_RATIO = 1.25


def flatten(weights: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> np.ndarray:
    """All parameters as one float64 vector (mapping values in their order)."""
    arrays = list(weights.values()) if isinstance(weights, Mapping) else list(weights)
    if not arrays:
        raise ValueError("a model without parameters")
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def pairwise_divergence(models: Sequence[np.ndarray]) -> np.ndarray:
    """Symmetric matrix d_ij (zero diagonal) of flattened models of equal length."""
    if len(models) < 2:
        raise ValueError(f"need at least two models, got {len(models)}")
    w = np.stack([np.asarray(m, dtype=np.float64).ravel() for m in models])
    norms = np.linalg.norm(w, axis=1)
    if np.any(norms == 0):
        raise ValueError("a model with all-zero weights has no relative divergence")
    n = len(w)
    d = np.zeros((n, n))
    for i in range(n):  # explicit differences: the Gram-matrix shortcut cancels badly for near-equal models
        d[i, i + 1:] = np.linalg.norm(w[i + 1:] - w[i], axis=1) / (0.5 * (norms[i] + norms[i + 1:]))
    return d + d.T


def robust_z_scores(values: Sequence[float]) -> np.ndarray:
    """Modified z-scores 0.6745 (x - median) / MAD (module docstring for the MAD = 0 fallback)."""
    x = np.asarray(values, dtype=float)
    med = np.median(x)
    mad = np.median(np.abs(x - med))
    if mad > 0:
        return MAD_TO_Z * (x - med) / mad
    mean_ad = np.mean(np.abs(x - med))
    if mean_ad > 0:
        return (x - med) / (MEANAD_TO_SD * mean_ad)
    return np.zeros_like(x)


@dataclass(frozen=True)
class DriftReport:
    """Divergences, scores and flags of one detection round (client ids in matrix order)."""

    client_ids: tuple[int, ...]
    divergence: np.ndarray
    median_divergence: np.ndarray
    z_scores: np.ndarray
    threshold: float
    min_ratio: float
    flagged: tuple[int, ...]

    def to_json(self) -> dict:
        return {"client_ids": list(self.client_ids), "divergence": self.divergence.round(6).tolist(),
                "median_divergence": self.median_divergence.round(6).tolist(),
                "z_scores": self.z_scores.round(4).tolist(), "threshold": self.threshold, "min_ratio": self.min_ratio,
                "flagged": list(self.flagged)}


def detect_drift(client_ids: Sequence[int], models: Sequence[np.ndarray], threshold: float = DEFAULT_THRESHOLD,
                 min_ratio: float = DEFAULT_MIN_RATIO) -> DriftReport:
    """Flag clients whose median divergence to the others has a robust z-score above ``threshold``
    and is at least ``min_ratio`` times the cohort's median (module docstring).

    With fewer than three clients there is no "rest" to compare with: nobody is flagged.
    """
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    if min_ratio < 1:
        raise ValueError(f"min_ratio must be >= 1, got {min_ratio}")
    if len(client_ids) != len(models):
        raise ValueError(f"{len(client_ids)} client ids for {len(models)} models")
    d = pairwise_divergence(models)
    n = len(models)
    off = d[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    med = np.median(off, axis=1)
    z = robust_z_scores(med) if n >= 3 else np.zeros(n)
    ratio = med / np.median(med) if np.median(med) > 0 else np.ones(n)
    flagged = tuple(int(c) for c, zi, ri in zip(client_ids, z, ratio) if zi > threshold and ri >= min_ratio)
    return DriftReport(tuple(int(c) for c in client_ids), d, med, z, float(threshold), float(min_ratio), flagged)


def detection_rates(flagged: Sequence[Sequence[int]], poisoned: Sequence[int | None],
                    participants: Sequence[Sequence[int]]) -> dict[str, float]:
    """Detection rate (poisoned client flagged) and false-positive rate (honest clients flagged) over runs."""
    hits = trials = fp = honest = 0
    for f, p, parts in zip(flagged, poisoned, participants, strict=True):
        fs = set(f)
        if p is not None:
            trials += 1
            hits += int(p in fs)
        honest_ids = [c for c in parts if c != p]
        honest += len(honest_ids)
        fp += sum(1 for c in honest_ids if c in fs)
    return {"detection_rate": hits / trials if trials else float("nan"), "poisoned_runs": trials,
            "false_positive_rate": fp / honest if honest else float("nan"), "honest_client_checks": honest,
            "false_positives": fp, "detections": hits}
