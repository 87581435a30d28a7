"""Clipping, noise calibration and sensitivity as pure functions.

References are to the seed paper "Understanding Differential Privacy in
Decentralized Federated Learning: A Controlled Privacy-Utility Comparison"
(Algorithms 1 and 2, Sec. 3.4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

FRAMEWORKS_FOR_SENSITIVITY = ("fl", "sequential-dfl")
#: neighbouring relations between client populations: one client's data replaced (the seed paper's, and
#: what sampling without replacement is accounted under), or one client added / removed (Poisson sampling)
RELATIONS = ("replace-one", "add-remove")


def global_l2_norm(arrays: Sequence[np.ndarray]) -> float:
    """L2 norm of a list of arrays seen as one flat vector (float32 input is squared in float64: no overflow)."""
    total = 0.0
    for a in arrays:
        a = np.asarray(a)
        if a.dtype == np.float32 or a.dtype == np.float16:
            a = a.astype(np.float64)
        total += float(np.vdot(a, a).real)
    return float(math.sqrt(total))


def clip_by_l2(arrays: Sequence[np.ndarray], clip_norm: float) -> tuple[list[np.ndarray], float, bool]:
    """Scale ``arrays`` (one flat vector) so that its L2 norm is at most ``clip_norm``.

    Returns the clipped arrays, the norm before clipping, and whether it was clipped.
    Uses ``min(1, C / ||x||)`` (Algorithm 1, line "clip").
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    norm = global_l2_norm(arrays)
    if not math.isfinite(norm):
        # Replies are validated before they reach a mechanism (strategies.reply_rules); a non-finite
        # norm here is a bug, and min(1, C / nan) would silently turn the whole release into NaN.
        raise ValueError(f"cannot clip arrays whose L2 norm is {norm} (non-finite values)")
    if norm <= clip_norm:
        return [np.array(a, copy=True) for a in arrays], norm, False
    scale = clip_norm / norm
    return [np.asarray(a * scale, dtype=a.dtype) for a in arrays], norm, True


def calibrate_sigma_abs(clip_norm: float, num_clients: float, eps_cal: float, delta_cal: float = 1e-5) -> float:
    """Absolute noise SD of the matched perturbation.

    ``sigma_abs = (C / N) * sqrt(2 ln(1.25 / delta_cal)) / eps_cal`` (the classical
    Gaussian-mechanism calibration applied to the FL mean's add/remove sensitivity C/N).
    FL and sequential DFL use the same value, which is what makes them "matched".

    ``num_clients`` is the cohort the FL mean divides by: N (full participation; an int), round(q N)
    under fixed-size client sampling, or the *expected* cohort q N under Poisson sampling (a float:
    DP-FedAvg's fixed denominator, McMahan et al. 2018), so sigma_abs keeps its meaning, eps_cal
    calibrates one round's release before any amplification by sampling (privacy.sampling).
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if not num_clients > 0:
        raise ValueError(f"num_clients must be > 0 (the cohort the mean divides by), got {num_clients}")
    if not eps_cal > 0:
        raise ValueError(f"eps_cal must be > 0, got {eps_cal}")
    if not 0 < delta_cal < 1:
        raise ValueError(f"delta_cal must be in (0, 1), got {delta_cal}")
    return (clip_norm / num_clients) * math.sqrt(2.0 * math.log(1.25 / delta_cal)) / eps_cal


def sensitivity(framework: str, clip_norm: float, num_clients: float, relation: str = "replace-one") -> float:
    """Client-level L2 sensitivity of one round's release under ``relation`` (:data:`RELATIONS`).

    FL: the mean of N clipped updates changes by at most 2C/N when one client is replaced
    (``replace-one``); a sum of clipped updates divided by a fixed denominator N (DP-FedAvg under
    Poisson sampling: N = q x population) changes by at most C/N when one client is added or removed
    (``add-remove``). Sequential DFL: the single clipped round update lies in the C-ball whoever
    took part, so it can change by 2C under either relation.
    """
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if framework == "fl":
        return (2.0 if relation == "replace-one" else 1.0) * clip_norm / num_clients
    if framework == "sequential-dfl":
        return 2.0 * clip_norm
    raise ValueError(f"framework must be one of {FRAMEWORKS_FOR_SENSITIVITY}, got {framework!r}")


def gaussian_noise_like(
    arrays: Sequence[np.ndarray], sigma: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """One draw z ~ N(0, sigma^2 I) shaped like ``arrays``, from an explicit generator."""
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    return [rng.normal(0.0, sigma, size=a.shape).astype(a.dtype, copy=False) for a in arrays]
