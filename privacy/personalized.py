"""Personalized DP noise from each client's re-identification risk (paper, Section VI).

Let m clients take part in a round, each with ARIREC A_i (privacy.anonymization.arirec).
The paper normalizes the risks, A~_i = A_i / sum_j A_j, and gives client i the noise
multiplier n_eps,i = m * n_eps * A~_i: riskier clients get more noise, and the multipliers
average to the global n_eps.

Where the noise goes. With server-side GDP (Flower's DifferentialPrivacyServerSideFixedClipping)
one draw N(0, sigma_GDP^2 I) with sigma_GDP = n_eps C / m is added to the mean of the m
clipped updates. For PDP the trusted server adds an independent draw to each clipped
update *before* averaging, with

    sigma_i = n_eps,i * C / sqrt(m) = sqrt(m) * n_eps * A~_i * C.

Why sqrt(m). The aggregate is sum_i p_i (Delta_i + z_i) (FedAvg weights p_i, sum 1), so its
noise has SD  sigma_agg = sqrt(sum_i p_i^2 sigma_i^2).  With equal weights p_i = 1/m:

    sigma_agg^2 = (1/m^2) sum_i m n_eps^2 A~_i^2 C^2 = (n_eps C)^2 * (sum_i A~_i^2) / m.

For equal risks (A~_i = 1/m) this is (n_eps C / m)^2 = sigma_GDP^2: the sqrt(m) is exactly
what makes m independent per-client draws add up to GDP's single draw on the mean. For
unequal risks sum_i A~_i^2 >= 1/m (Cauchy-Schwarz), so PDP's aggregate noise is GDP's times
sqrt(m sum_i A~_i^2) >= 1 (1.00008 for ten risks spread evenly over the paper's 0.1168-0.1214):
the same noise on average, redistributed toward the riskier clients. With FedAvg's size weights
p_i the ratio can dip just below 1 (0.99983 in the study: smaller clients have larger ARIREC). Without the sqrt(m) (sigma_i =
n_eps,i C), the aggregate would carry sqrt(m) times GDP's noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def normalized_risks(arirec: Sequence[float]) -> np.ndarray:
    """A~_i = A_i / sum_j A_j (each A_i must be > 0)."""
    a = np.asarray(arirec, dtype=float)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"need a non-empty vector of risks, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"risks must be finite and > 0, got {a.tolist()}")
    return a / a.sum()


def personalized_noise_multipliers(arirec: Sequence[float], noise_multiplier: float) -> np.ndarray:
    """n_eps,i = m * n_eps * A~_i (their mean is n_eps)."""
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    a = normalized_risks(arirec)
    return len(a) * noise_multiplier * a


def personalized_sigmas(arirec: Sequence[float], noise_multiplier: float, clip_norm: float) -> np.ndarray:
    """Per-client noise SD sigma_i = n_eps,i * C / sqrt(m), added to each clipped update."""
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    n_i = personalized_noise_multipliers(arirec, noise_multiplier)
    return n_i * clip_norm / math.sqrt(len(n_i))


def gdp_sigma(noise_multiplier: float, clip_norm: float, num_clients: int) -> float:
    """Server-side GDP's SD on the aggregate, n_eps * C / m (Flower's compute_stdv)."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    return noise_multiplier * clip_norm / num_clients


def aggregate_sigma(sigmas: Sequence[float], weights: Sequence[float]) -> float:
    """SD of sum_i p_i z_i for independent z_i ~ N(0, sigma_i^2), p = weights / sum(weights)."""
    s = np.asarray(sigmas, dtype=float)
    w = np.asarray(weights, dtype=float)
    if s.shape != w.shape:
        raise ValueError(f"{s.size} sigmas for {w.size} weights")
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {w.tolist()}")
    p = w / w.sum()
    return float(math.sqrt(np.sum(p**2 * s**2)))
