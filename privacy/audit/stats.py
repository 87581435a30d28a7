"""Statistics of an empirical privacy audit: a lower bound with stated confidence, and a point estimate.

An audit sees one score per canary (how strongly the released models point at it) and knows which
canaries were inserted. Two numbers come out, never mixed up:

``eps_lower`` (a statistical guarantee)
    With probability at least ``confidence`` over the mechanism's randomness, the mechanism is *not*
    (eps, delta)-DP for any eps below this value. For a threshold t, a DP mechanism obeys
    TPR(t) <= e^eps FPR(t) + delta (and the same with the roles of TNR and FNR), so
    eps >= log((TPR_lo - delta) / FPR_hi) with Clopper-Pearson bounds TPR_lo, FPR_hi
    (``scipy.stats.beta``, each at level alpha / 2: a union bound). The threshold (and direction)
    is chosen on one random half of the canaries and the bound is computed on the other half, so
    the choice costs no multiple-testing correction (the half split, not Bonferroni).
    Caveat shared with Andrew et al. (2024): canaries inserted into one run are not independent
    trials; the bound treats them as such (see docs/audit.md).
``eps_point`` (an estimate, no guarantee)
    Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for
    Federated Learning" (ICLR 2024), Sec. 3: fit a Gaussian to the held-out canaries' scores and
    one to the inserted canaries' scores, and report the epsilon at delta of that pair of
    Gaussians: with a pooled SD (mu-GDP, the headline) and with separate SDs
    (:func:`gaussian_pair_epsilon`, exact for unequal variances; see :func:`point_estimate`).

Exact reference values: :func:`gdp_epsilon` (a mu-GDP mechanism's epsilon at delta, Dong, Roth &
Su 2022, inverted by Opacus' ``eps_from_mu``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

from privacy.opacus_import import import_opacus

EPS_MAX = 100.0  # search bracket of epsilon; larger values are reported as this cap (flagged)


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two one-sided Clopper-Pearson bounds of a binomial proportion, each at level ``alpha``.

    Returns (lo, hi): P(p < lo) <= alpha and P(p > hi) <= alpha. ``scipy.stats.beta`` quantiles.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, n={n}], got {k}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))
    return lo, hi


#: The largest epsilon :func:`gdp_epsilon` reports (Opacus' inversion bracket); larger values read "> 500".
EPS_CAP = 500.0


def format_eps(x: float | None, none: str = "n/a") -> str:
    """An epsilon for a table: 3 significant digits, "inf", "> 500" at :data:`EPS_CAP`, ``none`` if absent."""
    if x is None:
        return none
    if math.isinf(x):
        return "inf"
    return f"> {EPS_CAP:g}" if x >= EPS_CAP else f"{x:.3g}"


def gdp_epsilon(mu: float, delta: float) -> float:
    """Epsilon at ``delta`` of a mu-GDP mechanism (exact; Opacus' ``eps_from_mu``); capped at :data:`EPS_CAP`."""
    _check_delta(delta)
    if not mu >= 0:
        raise ValueError(f"mu must be >= 0, got {mu}")
    if mu == 0:
        return 0.0
    import_opacus()  # here, not at import: strategies and a deployed ClientApp import this module (Opacus: ~3 s under load)
    from opacus.accountants.analysis import gdp as opacus_gdp

    try:
        return float(opacus_gdp.eps_from_mu(mu=mu, delta=delta))
    except ValueError:  # delta(eps=0) < delta already, or eps beyond Opacus' bracket
        return 0.0 if float(opacus_gdp.delta_eps_mu(eps=0.0, mu=mu)) <= delta else EPS_CAP


def _likelihood_set_mass(m0: float, s0: float, m1: float, s1: float, eps: float) -> float:
    """delta(eps) = P1(L > eps) - e^eps P0(L > eps), L = log(p1 / p0), for 1-D Gaussians P0, P1.

    L(x) - eps is the quadratic a x^2 + b x + c; the set where it is positive is an interval, the
    complement of one, or a half-line (a = 0), whose masses are normal CDF differences.
    """
    a = 1 / (2 * s0 ** 2) - 1 / (2 * s1 ** 2)
    b = m1 / s1 ** 2 - m0 / s0 ** 2
    c = m0 ** 2 / (2 * s0 ** 2) - m1 ** 2 / (2 * s1 ** 2) + math.log(s0 / s1) - eps

    def cdf(x: float, m: float, s: float) -> float:  # the normal CDF without scipy.stats' per-call overhead
        return float(special.ndtr((x - m) / s))

    def mass(m: float, s: float) -> float:
        if abs(a) < 1e-12 * (abs(b) + 1e-300) or a == 0:
            if b == 0:
                return 1.0 if c > 0 else 0.0
            x0 = -c / b
            return float(special.ndtr((m - x0) / s) if b > 0 else cdf(x0, m, s))
        disc = b * b - 4 * a * c
        if disc <= 0:  # no sign change: positive everywhere iff a > 0
            return 1.0 if a > 0 else 0.0
        r = math.sqrt(disc)
        x1, x2 = sorted(((-b - r) / (2 * a), (-b + r) / (2 * a)))
        inside = cdf(x2, m, s) - cdf(x1, m, s)
        return 1.0 - inside if a > 0 else inside

    return max(0.0, mass(m1, s1) - math.exp(eps) * mass(m0, s0))


def gaussian_pair_epsilon(m0: float, s0: float, m1: float, s1: float, delta: float) -> float:
    """Smallest eps with which N(m0, s0^2) and N(m1, s1^2) are (eps, delta)-indistinguishable (both ways).

    Exact for unequal variances (see :func:`_likelihood_set_mass`); with s0 = s1 = s it equals
    :func:`gdp_epsilon` at mu = |m1 - m0| / s. Capped at :data:`EPS_MAX`.
    """
    _check_delta(delta)
    if not (s0 > 0 and s1 > 0):
        raise ValueError(f"standard deviations must be > 0, got {s0}, {s1}")

    def delta_at(eps: float) -> float:
        return max(_likelihood_set_mass(m0, s0, m1, s1, eps), _likelihood_set_mass(m1, s1, m0, s0, eps))

    if delta_at(0.0) <= delta:
        return 0.0
    if delta_at(EPS_MAX) > delta:
        return EPS_MAX
    return float(optimize.brentq(lambda e: delta_at(e) - delta, 0.0, EPS_MAX, xtol=1e-9))


def point_estimate(scores_in: np.ndarray, scores_out: np.ndarray, delta: float) -> dict:
    """Andrew et al.'s estimate: the epsilon of Gaussians fitted to the inserted and held-out scores.

    ``eps_point``: one pooled SD (the Gaussian mechanism shifts the statistic without changing its
    spread, so the pair is mu-GDP with mu = |mean_in - mean_out| / sd). ``eps_point_unequal_var``:
    each group its own SD (Andrew et al. fit the observed canaries' SD separately); at small delta it
    is dominated by the tails of the wider Gaussian, so with tens of canaries it is unstable (a 30%
    SD mismatch from sampling alone gives eps > 10): reported, labelled, not the headline.
    """
    s_in, s_out = _scores(scores_in, "scores_in", 2), _scores(scores_out, "scores_out", 2)
    m1, s1 = float(np.mean(s_in)), float(np.std(s_in, ddof=1))
    m0, s0 = float(np.mean(s_out)), float(np.std(s_out, ddof=1))
    if s0 == 0 or s1 == 0:
        raise ValueError("scores have zero spread; the audit needs noisy releases (is the noise missing?)")
    pooled = math.sqrt(((s_in.size - 1) * s1 ** 2 + (s_out.size - 1) * s0 ** 2) / (s_in.size + s_out.size - 2))
    mu = abs(m1 - m0) / pooled
    eps = gdp_epsilon(mu, delta)
    return {"eps_point": eps, "mu_point": mu, "eps_point_capped": eps >= EPS_CAP,
            "eps_point_unequal_var": gaussian_pair_epsilon(m0, s0, m1, s1, delta),
            "mean_in": m1, "sd_in": s1, "mean_out": m0, "sd_out": s0}


def _scores(x: np.ndarray, name: str, min_n: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size < min_n:
        raise ValueError(f"{name}: need at least {min_n} scores, got {a.size}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: scores must be finite")
    return a


def _bound_at(pos: np.ndarray, neg: np.ndarray, t: float, sign: int, delta: float, alpha: float) -> float:
    """eps lower bound at threshold t: 'positive' = sign * score > sign * t (union bound, alpha / 2 each)."""
    tp = int(np.sum(sign * pos > sign * t))
    fp = int(np.sum(sign * neg > sign * t))
    tpr_lo, _ = clopper_pearson(tp, pos.size, alpha / 2)
    _, fpr_hi = clopper_pearson(fp, neg.size, alpha / 2)
    if tpr_lo - delta <= 0:
        return 0.0
    return max(0.0, math.log((tpr_lo - delta) / fpr_hi))


def _best_threshold(pos: np.ndarray, neg: np.ndarray, delta: float, alpha: float) -> tuple[float, int, float]:
    """The (threshold, direction) with the largest bound on the selection half (vectorized over thresholds).

    Candidates are the midpoints between consecutive distinct scores (and points beyond both ends),
    not the scores themselves, and among equally good candidates the middle one is taken: the
    threshold then sits in the middle of the gap that separates the selection half, not at the
    edge of it, where the held-out evaluation half would cross it by chance (issue 37).
    """
    u = np.unique(np.concatenate([pos, neg]))
    ts = np.concatenate([[u[0] - 1.0], (u[:-1] + u[1:]) / 2, [u[-1] + 1.0]])
    best = (float(ts[0]), 1, -1.0)
    for sign in (1, -1):  # inserted canaries score high (TPR vs FPR) or low (TNR vs FNR)
        p, n = np.sort(sign * pos), np.sort(sign * neg)
        tp = p.size - np.searchsorted(p, sign * ts, side="right")
        fp = n.size - np.searchsorted(n, sign * ts, side="right")
        tpr_lo = np.where(tp > 0, stats.beta.ppf(alpha / 2, np.maximum(tp, 1), p.size - tp + 1), 0.0)
        fpr_hi = np.where(fp < n.size, stats.beta.ppf(1 - alpha / 2, fp + 1, np.maximum(n.size - fp, 1)), 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.where(tpr_lo > delta, np.log(np.maximum(tpr_lo - delta, 1e-300) / fpr_hi), 0.0)
        top = np.flatnonzero(b == b.max())
        i = int(top[top.size // 2])  # the middle of the (possibly several) equally good thresholds
        if b[i] > best[2]:
            best = (float(ts[i]), sign, float(b[i]))
    return best


def epsilon_lower_bound(scores_in: np.ndarray, scores_out: np.ndarray, delta: float, confidence: float = 0.95,
                        rng: np.random.Generator | None = None) -> dict:
    """eps such that, with probability >= ``confidence``, the mechanism is not (eps', delta)-DP for eps' < eps.

    Half of each group (chosen by ``rng``) selects the threshold; the other half gives the
    Clopper-Pearson bound there. Returns the bound, the threshold, its direction and the counts.
    """
    _check_delta(delta)
    _check_confidence(confidence)
    s_in, s_out = _scores(scores_in, "scores_in", 2), _scores(scores_out, "scores_out", 2)
    rng = rng if rng is not None else np.random.default_rng()
    p_in, p_out = rng.permutation(s_in.size), rng.permutation(s_out.size)
    sel_in, ev_in = s_in[p_in[: s_in.size // 2]], s_in[p_in[s_in.size // 2:]]
    sel_out, ev_out = s_out[p_out[: s_out.size // 2]], s_out[p_out[s_out.size // 2:]]
    alpha = 1 - confidence
    t, sign, _ = _best_threshold(sel_in, sel_out, delta, alpha)
    eps = _bound_at(ev_in, ev_out, t, sign, delta, alpha)
    return {"eps_lower": eps, "confidence": confidence, "delta": delta, "threshold": t,
            "direction": "inserted-high" if sign > 0 else "inserted-low",
            "n_in_eval": int(ev_in.size), "n_out_eval": int(ev_out.size),
            "threshold_choice": "half split (select on one half, bound on the other)"}


def max_certifiable_epsilon(n_in_eval: int, n_out_eval: int, delta: float, confidence: float = 0.95) -> float:
    """The largest lower bound these sample sizes can give (every canary classified right)."""
    alpha = 1 - confidence
    tpr_lo, _ = clopper_pearson(n_in_eval, n_in_eval, alpha / 2)
    _, fpr_hi = clopper_pearson(0, n_out_eval, alpha / 2)
    return max(0.0, math.log(max(tpr_lo - delta, 1e-300) / fpr_hi))
