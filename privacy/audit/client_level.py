"""Client-level audit in one training run (Andrew et al., ICLR 2024): score canaries on the released models.

What the auditor sees: the released models (every round's, or only the final one), the canaries it
made and which of them it inserted. Never the noise, the clients' updates, or the server's state.

Statistic. The cosine between a canary c_k and a model change Delta (Andrew et al., Sec. 3):
``cos_k = <c_k, Delta> / (||c_k|| ||Delta||)``.

* final-model threat model: Delta = w_T - w_0, one cosine per canary;
* all-iterates threat model: Delta_t = w_t - w_{t-1} for every round, combined as the sum over
  rounds of cos_{k,t}. A canary present in every round adds the same direction each round while the
  noise is independent, so (with ||Delta_t|| nearly constant) the sum is the Neyman-Pearson
  statistic of T Gaussian releases: its separation grows as sqrt(T), like the mu of the
  T-fold composed Gaussian mechanism (mu-GDP, Dong, Roth & Su).

Both are turned into a lower bound and a point estimate by :mod:`privacy.audit.stats`. Threat
model of the audited mechanisms: the server is trusted; the noise should hide one client's
participation from anyone who sees the released models, which is exactly this auditor's view.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from privacy.audit.canaries import CanarySet
from privacy.audit.stats import epsilon_lower_bound, gdp_epsilon, point_estimate

THREAT_MODELS = ("all-iterates", "final-model")


def float_keys(model: Mapping[str, np.ndarray]) -> list[str]:
    """The model's floating-point arrays (the trainable part a canary lives in), in order."""
    return [k for k, v in model.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]


def flat_params(model: Mapping[str, np.ndarray]) -> np.ndarray:
    """The model's floating-point arrays as one float64 vector (integer buffers left out)."""
    keys = float_keys(model)
    if not keys:
        raise ValueError("the model has no floating-point arrays to audit")
    return np.concatenate([np.asarray(model[k], dtype=np.float64).ravel() for k in keys])


def split_like(vec: np.ndarray, model: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of :func:`flat_params`: float64 pieces shaped like ``model``'s float arrays."""
    keys = float_keys(model)
    total = int(sum(np.asarray(model[k]).size for k in keys))
    if total != vec.size:
        raise ValueError(f"vector of size {vec.size} does not fit a model with {total} float parameters")
    out, i = {}, 0
    for k in keys:
        n = int(np.asarray(model[k]).size)
        out[k] = vec[i:i + n].reshape(np.asarray(model[k]).shape)
        i += n
    return out


def canary_projections(canaries: CanarySet, change: np.ndarray) -> np.ndarray:
    """<c_k / ||c_k||, change> for every canary: the change along each canary's unit direction."""
    change = np.asarray(change, dtype=np.float64)
    if change.shape != (canaries.dim,):
        raise ValueError(f"model change has shape {change.shape}, the canaries live in R^{canaries.dim}")
    # In the canaries' dtype (float32 for large sets: no float64 copy of K x d per release).
    dots = (canaries.vectors @ change.astype(canaries.vectors.dtype, copy=False)).astype(np.float64)
    return dots / canaries.norms


def canary_cosines(canaries: CanarySet, change: np.ndarray) -> np.ndarray:
    """cos(c_k, change) for every canary (0 when the model did not change)."""
    norm = float(np.linalg.norm(np.asarray(change, dtype=np.float64)))
    proj = canary_projections(canaries, change)
    return proj / norm if norm > 0 else np.zeros_like(proj)


class ReleaseObserver:
    """Accumulates the canaries' statistics from the released models, one release at a time."""

    def __init__(self, canaries: CanarySet, initial: np.ndarray) -> None:
        initial = np.asarray(initial, dtype=np.float64)
        if initial.shape != (canaries.dim,):
            raise ValueError(f"initial model has {initial.size} float parameters, canaries have dim {canaries.dim}")
        self.canaries = canaries
        self.initial = initial.copy()
        self.previous = initial.copy()
        self.sum_cos = np.zeros(canaries.vectors.shape[0])
        self.projections: list[np.ndarray] = []  # per release: the change along every canary's unit direction
        self.rounds = 0

    def observe(self, released: np.ndarray) -> None:
        """One released model (the next round's, or the next chain hop's for sequential DFL)."""
        released = np.asarray(released, dtype=np.float64)
        change = released - self.previous
        proj = canary_projections(self.canaries, change)
        norm = float(np.linalg.norm(change))
        self.sum_cos += proj / norm if norm > 0 else 0.0
        self.projections.append(proj)
        self.previous = released.copy()
        self.rounds += 1

    def held_out_projections(self) -> np.ndarray:
        """(releases, K_out): each release's change along the held-out canaries' directions (pure noise
        plus the release's signal along a direction the mechanism never saw; privacy.audit.verdict)."""
        if self.rounds == 0:
            raise RuntimeError("no released model observed yet")
        return np.stack(self.projections)[:, ~self.canaries.inserted]

    def scores(self) -> dict[str, np.ndarray]:
        """The statistic of each canary under each threat model."""
        if self.rounds == 0:
            raise RuntimeError("no released model observed yet")
        return {"all-iterates": self.sum_cos.copy(),
                "final-model": canary_cosines(self.canaries, self.previous - self.initial)}


def estimate(canaries: CanarySet, scores: Mapping[str, np.ndarray], delta: float, confidence: float = 0.95,
             rng: np.random.Generator | None = None) -> dict:
    """Lower bound and point estimate per threat model and canary group.

    Returns ``{threat_model: {group: {"eps_lower", "eps_point", ...}}}`` (group "-1" = one population).
    """
    rng = rng if rng is not None else np.random.default_rng()
    out: dict[str, dict[str, dict]] = {}
    for tm, s in scores.items():
        if tm not in THREAT_MODELS:
            raise ValueError(f"unknown threat model {tm!r}; allowed: {THREAT_MODELS}")
        s = np.asarray(s, dtype=np.float64)
        out[tm] = {}
        for g in sorted({int(x) for x in canaries.groups}):
            mine = canaries.groups == g
            s_in, s_out = s[mine & canaries.inserted], s[mine & ~canaries.inserted]
            res = {**epsilon_lower_bound(s_in, s_out, delta, confidence, rng), **point_estimate(s_in, s_out, delta)}
            out[tm][str(g)] = res
    return out


def formal_add_remove_epsilon(signal_over_sigma: list[float], delta: float) -> float:
    """The epsilon the mechanism claims for one canary under add/remove adjacency, from its own ledger.

    Round t releases the canary's contribution s_t (its weight times C) under Gaussian noise of SD
    sigma_t; T such releases compose to mu-GDP with mu = sqrt(sum (s_t / sigma_t)^2) (Dong, Roth &
    Su 2022, Cor. 3.3). This is what the audit's numbers are comparable to.
    """
    r = np.asarray(signal_over_sigma, dtype=np.float64)
    if r.size == 0 or np.any(r < 0) or not np.all(np.isfinite(r)):
        raise ValueError(f"signal_over_sigma must be finite, >= 0 and non-empty, got {r}")
    return gdp_epsilon(float(np.sqrt(np.sum(r ** 2))), delta)
