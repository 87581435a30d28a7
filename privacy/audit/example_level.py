"""Example-level privacy audit of DP-SGD in one training run (Steinke, Nasr, Jagielski, NeurIPS 2023).

The auditor inserts m canary examples, each independently with probability 1/2 (its own secret
coin flips), trains once, scores every canary on what it is allowed to see (the released
model(s)), guesses "in" for the k+ highest scores and "out" for the k- lowest, and counts the
correct guesses. If the training run is (eps, delta)-DP with respect to one example, the number
of correct guesses among r guesses is dominated by Binomial(r, e^eps / (1 + e^eps)) up to a
delta term (the paper's Theorem 5.2 and its delta extension, Proposition 5.7 / Algorithm 3 in the
appendix). Inverting that tail at level 1 - confidence gives an epsilon *lower bound*: with
probability >= confidence over the coin flips, a mechanism whose true epsilon is below the bound
would not have produced this many correct guesses.

Threat model: the auditor is the adversary of example-level DP for one client's data -- it
knows the canaries and its own inclusion bits, and sees the models the audited training releases
(white box: every released update, or only the final model; the caller's scores decide which).
It never sees the other examples. Whom the guarantee protects: each single example of the
audited training set, against anyone who sees those releases.

Statistics (everything from scipy):

* ``eps_lower``: the one-run lower bound at ``confidence``; when several (k+, k-) choices are
  tried, each is tested at level (1 - confidence) / #choices (Bonferroni), so the maximum over
  choices keeps the stated confidence.
* ``eps_point``: separately labelled plug-in estimate log(v' / (r' - v')) with v' = v + 1/2 and
  r' = r + 1, the epsilon of randomized response whose accuracy equals the observed one -- no
  confidence attached, delta ignored; a description of the attack's strength, never a bound.
* ``eps_gaussian_fit``: separately labelled point estimate of Andrew et al. (ICLR 2024): the
  epsilon at delta of the two Gaussians fitted to the included and the excluded canaries' scores
  (:func:`privacy.audit.stats.point_estimate`, shared with the client-level audit). Tight when the
  scores are Gaussian (white-box Dirac canaries); no confidence attached, noisy with few canaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, stats

from privacy.audit import stats as audit_stats

DEFAULT_K_FRACTIONS = (0.05, 0.1, 0.2, 0.5)  # k+ = k- = fraction * m, chosen before seeing any score
EPS_MAX = 100.0  # bisection cap: beyond this the binomial tail underflows; reported as a bound of EPS_MAX


def _check_counts(m: int, r: int, v: int) -> None:
    if not (isinstance(m, (int, np.integer)) and isinstance(r, (int, np.integer)) and isinstance(v, (int, np.integer))):
        raise TypeError(f"m, r, v must be integers, got {m!r}, {r!r}, {v!r}")
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v (correct) <= r (guesses) <= m (canaries), got v={v}, r={r}, m={m}")


def _check_delta(delta: float) -> None:
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[>= v correct of r guesses] under the null hypothesis "the run is (eps, delta)-DP".

    The paper's Algorithm 3 (appendix): beta = P[Binomial(r, q) >= v] with q = e^eps / (1 + e^eps),
    plus the delta correction 2 m delta * max_{1 <= i <= v} P[v - i <= Binomial(r, q) < v] / i.

    Parameters
    ----------
    m : number of canaries (each included with probability 1/2).
    r : number of guesses (abstentions excluded).
    v : number of correct guesses.
    eps, delta : the null hypothesis' DP guarantee (eps >= 0, 0 <= delta < 1).
    """
    _check_counts(m, r, v)
    _check_delta(delta)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    q = float(stats.logistic.cdf(eps))  # e^eps / (1 + e^eps): accuracy of eps-DP randomized response
    tail = float(stats.binom.sf(v - 1, r, q))
    if v == 0 or delta == 0:
        return min(tail, 1.0)
    # cumulative P[v - i <= B < v] for i = 1..v, divided by i; the maximum over i
    pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)
    alpha = float(np.max(np.cumsum(pmf) / np.arange(1, v + 1)))
    return min(tail + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest eps rejected at level 1 - ``confidence`` (0 when even eps = 0 is not rejected).

    p_value is non-decreasing in eps, so the bound is the root of p_value(eps) = 1 - confidence
    (scipy's brentq; capped at :data:`EPS_MAX`).
    """
    _check_counts(m, r, v)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    level = 1.0 - confidence
    f = lambda e: p_value(m, r, v, e, delta) - level
    if f(0.0) >= 0:
        return 0.0
    if f(EPS_MAX) < 0:
        return EPS_MAX
    return float(optimize.brentq(f, 0.0, EPS_MAX, xtol=1e-6))


def point_estimate(r: int, v: int) -> float:
    """Plug-in estimate: eps of randomized response whose accuracy is (v + 1/2) / (r + 1); no confidence."""
    if not 0 <= v <= r:
        raise ValueError(f"need 0 <= v <= r, got v={v}, r={r}")
    if r == 0:
        return 0.0
    acc = (v + 0.5) / (r + 1.0)
    return max(0.0, math.log(acc / (1.0 - acc)))


def gaussian_fit_epsilon(scores: np.ndarray, included: np.ndarray, delta: float) -> float:
    """Point estimate (Andrew et al. 2024): epsilon of the Gaussians fitted to included / excluded scores.

    The same estimator as the client-level audit (:func:`privacy.audit.stats.point_estimate`); nan when
    a side has fewer than 2 canaries or the scores have no spread.
    """
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included, dtype=bool)
    try:
        return float(audit_stats.point_estimate(scores[included], scores[~included], delta)["eps_point"])
    except ValueError:
        return math.nan


def guesses(scores: np.ndarray, k_plus: int, k_minus: int) -> np.ndarray:
    """+1 ("in") for the k+ highest scores, -1 ("out") for the k- lowest, 0 (abstain) otherwise.

    Ties are broken by position (a stable sort), never by the inclusion bits.
    """
    scores = np.asarray(scores, dtype=float)
    m = scores.size
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need k+ >= 0, k- >= 0 and k+ + k- <= m = {m}, got k+={k_plus}, k-={k_minus}")
    order = np.argsort(scores, kind="stable")
    g = np.zeros(m, dtype=np.int8)
    if k_minus:
        g[order[:k_minus]] = -1
    if k_plus:
        g[order[m - k_plus:]] = 1
    return g


@dataclass(frozen=True)
class OneRunAudit:
    """One one-run audit's outcome (what audit.json stores)."""

    m: int  # canaries
    included: int  # canaries the coin flips put into the training set
    k_plus: int
    k_minus: int
    guesses: int  # r
    correct: int  # v
    delta: float
    confidence: float
    choices_tried: int  # (k+, k-) pairs tested (Bonferroni)
    eps_lower: float  # lower bound at `confidence`
    eps_point: float  # plug-in estimate from the guessing accuracy (no confidence)
    eps_gaussian_fit: float  # Gaussian-fit (mu-GDP) point estimate (no confidence)

    def to_dict(self) -> dict:
        return asdict(self)


def k_choices(m: int, fractions: Sequence[float] = DEFAULT_K_FRACTIONS) -> list[tuple[int, int]]:
    """Symmetric (k+, k-) = (k, k) with k = round(f * m) >= 1, deduplicated; fixed before any score is seen."""
    if m < 2:
        raise ValueError(f"an audit needs at least 2 canaries, got m={m}")
    if not fractions or any(not 0 < f <= 0.5 for f in fractions):
        raise ValueError(f"fractions must be in (0, 0.5], got {list(fractions)}")
    ks = sorted({max(1, min(m // 2, round(f * m))) for f in fractions})
    return [(k, k) for k in ks]


def audit_from_scores(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = 0.95,
                      choices: Sequence[tuple[int, int]] | None = None) -> OneRunAudit:
    """The one-run audit of canaries with attack ``scores`` (higher = "more likely in") and inclusion bits.

    Parameters
    ----------
    scores : (m,) finite floats computed from the released model(s) only.
    included : (m,) bools, the auditor's own coin flips (never seen by the training).
    delta : the delta of the audited guarantee (the same delta as the formal epsilon).
    confidence : confidence of the lower bound, shared by all ``choices`` (Bonferroni).
    choices : (k+, k-) pairs fixed in advance; default :func:`k_choices`.

    Returns
    -------
    The (k+, k-) choice with the largest lower bound (ties: the most guesses), its counts, the bound
    and the point estimates.
    """
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included)
    if scores.ndim != 1 or included.shape != scores.shape:
        raise ValueError(f"scores and included must be 1-d of the same length, got {scores.shape}, {included.shape}")
    if included.dtype != bool:
        raise ValueError(f"included must be booleans (the coin flips), got dtype {included.dtype}")
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"scores must be finite; {int((~np.isfinite(scores)).sum())} are not")
    _check_delta(delta)
    m = scores.size
    choices = list(choices) if choices is not None else k_choices(m)
    if not choices:
        raise ValueError("choices must not be empty")
    level_conf = 1.0 - (1.0 - confidence) / len(choices)
    truth = np.where(included, 1, -1)
    best: OneRunAudit | None = None
    fit = gaussian_fit_epsilon(scores, included, delta)
    for kp, km in choices:
        g = guesses(scores, kp, km)
        r = int(np.count_nonzero(g))
        v = int(np.count_nonzero(g == truth))
        res = OneRunAudit(m, int(included.sum()), kp, km, r, v, delta, confidence, len(choices),
                          epsilon_lower_bound(m, r, v, delta, level_conf), point_estimate(r, v), fit)
        # ties (e.g. every bound 0) go to the most guesses: never chosen by the point estimate
        if best is None or (res.eps_lower, res.guesses) > (best.eps_lower, best.guesses):
            best = res
    assert best is not None
    return best


def inclusion_bits(m: int, rng: np.random.Generator) -> np.ndarray:
    """The auditor's coin flips: each of m canaries included independently with probability 1/2."""
    if m < 2:
        raise ValueError(f"an audit needs at least 2 canaries, got m={m}")
    return rng.random(m) < 0.5


def dirac_canaries(m: int, dim: int, clip_norm: float, rng: np.random.Generator) -> np.ndarray:
    """Gradient-space (Dirac) canaries: m distinct coordinate directions of norm ``clip_norm``, shape (m, dim).

    White-box only: the auditor injects these as per-example gradients and scores each by the
    released update's coordinate (the dot product with the model change).
    """
    if not 1 <= m <= dim:
        raise ValueError(f"need 1 <= m <= dim for distinct Dirac canaries, got m={m}, dim={dim}")
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    coords = rng.choice(dim, size=m, replace=False)
    out = np.zeros((m, dim))
    out[np.arange(m), coords] = clip_norm
    return out


def dirac_scores(canaries: np.ndarray, gradient_sum: np.ndarray) -> np.ndarray:
    """Score of each gradient canary: <canary, released noisy gradient sum over all steps>.

    For plain SGD the released gradient sum is (w_0 - w_T) / lr, i.e. minus the model change.
    """
    canaries = np.asarray(canaries, dtype=float)
    gradient_sum = np.asarray(gradient_sum, dtype=float)
    if canaries.ndim != 2 or gradient_sum.shape != (canaries.shape[1],):
        raise ValueError(f"canaries (m, d) and gradient_sum (d,) expected, got {canaries.shape}, "
                         f"{gradient_sum.shape}")
    return canaries @ gradient_sum


# ----------------------------------------------------------------------------- white-box gradient canaries
# Issue 37: input-space canaries have no power at CPU scale; gradient canaries inside the DP optimizer's
# step (privacy.dpsgd.canaries: Nasr et al. 2023's Dirac canaries, all-iterates white box) see every
# privatized gradient sum, so the noise itself can be measured and tested against the configured z C.

GRADIENT_TESTS = 3  # measured noise, separation, one-run lower bound: Bonferroni over ALPHA


def _check_gradient_observations(projections: np.ndarray, sampled: np.ndarray, included: np.ndarray):
    p = np.asarray(projections, dtype=np.float64)
    s = np.asarray(sampled)
    inc = np.asarray(included)
    if p.ndim != 2 or p.shape[0] < 1 or s.shape != p.shape or inc.shape != (p.shape[1],):
        raise ValueError(f"projections and sampled must be (steps >= 1, m) and included (m,), got {p.shape}, "
                         f"{s.shape}, {inc.shape}")
    if s.dtype != bool or inc.dtype != bool:
        raise ValueError(f"sampled and included must be booleans, got {s.dtype}, {inc.dtype}")
    if not np.all(np.isfinite(p)):
        raise ValueError(f"projections must be finite; {int((~np.isfinite(p)).sum())} are not")
    if inc.sum() < 2 or (~inc).sum() < 2:
        raise ValueError(f"need >= 2 inserted and >= 2 held-out canaries, got {int(inc.sum())} and {int((~inc).sum())}")
    return p, s, inc


def conditioned_scores(projections: np.ndarray, sampled: np.ndarray, noise_sd: float) -> tuple[np.ndarray, np.ndarray]:
    """Per canary j: s_j = sum over its sampled steps of its projection / (noise_sd sqrt(n_j)), and n_j.

    The auditor who inserts a canary knows the steps it sampled it in (its own draws, the same for held-out
    canaries, which are just never added). Given those n_j steps, canary j faces n_j Gaussian mechanisms of
    sensitivity C and SD z C: a sqrt(n_j) / z-GDP composition, whose optimal statistic is this sum. Under
    the configured noise s_j ~ N(sqrt(n_j) / z, 1) for an inserted canary and N(0, 1) for a held-out one
    (plus the real clipped sum's coordinate, which only adds spread). n_j = 0 gives nan.
    """
    p = np.asarray(projections, dtype=np.float64)
    s = np.asarray(sampled, dtype=bool)
    n = s.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = (p * s).sum(0) / (noise_sd * np.sqrt(n))
    return np.where(n > 0, scores, np.nan), n


def gradient_canary_verdict(projections: np.ndarray, sampled: np.ndarray, included: np.ndarray, *,
                            noise_multiplier: float, clip_norm: float, eps_formal: float, delta: float,
                            alpha: float | None = None) -> dict:
    """The verdict of a white-box gradient-canary audit of DP-SGD, every reference from the configured knobs.

    Parameters
    ----------
    projections : (steps, m)
        The privatized (noised) gradient sum of every step along each canary's unit direction.
    sampled : (steps, m) bool
        Whether the auditor sampled canary j at that step (rate q); an inserted canary was added then.
    included : (m,) bool
        The auditor's coin flips: inserted (True) or held out (never added).
    noise_multiplier, clip_norm : float
        The *configured* z and C (never what the optimizer reports): the noise SD of every step is z C.
    eps_formal : float
        The accountant's epsilon of one example of this training at ``delta`` from the configured z, the
        loader's q and the steps (the reference of the lower bound).
    alpha : float or None
        Family-wise level of the three tests (default :data:`privacy.audit.verdict.ALPHA`), split equally.

    Returns
    -------
    dict
        :func:`privacy.audit.verdict.decide`'s verdict with the tests behind it, plus the scores.

    Tests (Bonferroni, alpha / 3 each):

    * ``measured-noise``: the held-out canaries' projections over all steps against SD z C
      (:func:`privacy.audit.verdict.noise_test`: chi^2 lower tail; the real gradient only adds energy);
    * ``separation``: :func:`conditioned_scores` of inserted vs held-out canaries against the formal
      mu = sqrt(mean n_j) / z (over the inserted canaries scored). Conservative: the scores' mean separation
      is mean(sqrt n_j) / z <= sqrt(mean n_j) / z (Jensen), and unequal n_j only widen the pooled SD;
    * ``lower-bound``: the one-run lower bound (Steinke et al. 2023, :func:`audit_from_scores`) of the
      canaries' projections summed over *all* steps (the score may not use the sampling, which the
      accountant's amplification assumes hidden) against ``eps_formal``, with its ceiling (every guess right).
    """
    from privacy.audit.verdict import ALPHA, decide, noise_test, separation_test

    p, s, inc = _check_gradient_observations(projections, sampled, included)
    if not (noise_multiplier > 0 and clip_norm > 0 and math.isfinite(noise_multiplier * clip_norm)):
        raise ValueError(f"need a configured noise multiplier z > 0 and clip norm C > 0, got z={noise_multiplier}, "
                         f"C={clip_norm}")
    if not (eps_formal >= 0):
        raise ValueError(f"eps_formal must be >= 0, got {eps_formal}")
    _check_delta(delta)
    a = (ALPHA if alpha is None else alpha) / GRADIENT_TESTS
    steps, m = p.shape
    noise_sd = noise_multiplier * clip_norm
    noise = noise_test(p[:, ~inc], np.full(steps, noise_sd), a)
    scores, n = conditioned_scores(p, s, noise_sd)
    ok = n > 0
    s_in, s_out = scores[inc & ok], scores[~inc & ok]
    if s_in.size >= 2 and s_out.size >= 2:
        mu_formal = math.sqrt(float(n[inc & ok].mean())) / noise_multiplier
        separation = separation_test(s_in, s_out, mu_formal, a)
    else:  # too few canaries ever sampled: no evidence either way (never fires, never counts as power)
        separation = {"test": "separation", "fired": False, "powered": False, "alpha": a,
                      "reason": f"only {s_in.size} inserted / {s_out.size} held-out canaries were ever sampled"}
    total = p.sum(0)  # all-iterates score without the sampling
    one_run = audit_from_scores(total, inc, delta, 1 - a)
    level_conf = 1 - a / one_run.choices_tried
    ceiling = max(epsilon_lower_bound(m, kp + km, kp + km, delta, level_conf) for kp, km in k_choices(m))
    bound = {"test": "lower-bound", "fired": bool(one_run.eps_lower > eps_formal),
             "powered": bool(ceiling > eps_formal), "alpha": a, "eps_lower": one_run.eps_lower, "ceiling": ceiling,
             "eps_formal": float(eps_formal), "correct": one_run.correct, "guesses": one_run.guesses}
    out = decide([noise, separation, bound])
    out.update({"measured_over_configured": noise["measured_over_configured"], "configured_noise_sd": noise_sd,
                "steps": steps, "sampled_steps_mean": float(n.mean()), "one_run": one_run.to_dict(),
                "scores_conditioned": [None if not np.isfinite(v) else float(v) for v in scores],
                "scores_all_steps": [float(v) for v in total]})
    return out
