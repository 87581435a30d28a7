"""The audit's verdict: tests that can fail, each against a reference the mechanism does not control.

Issue 37. A lower bound alone cannot flag a bug at the studies' settings (its ceiling with a few
hundred canaries is below the formal epsilon), and a formal epsilon computed from the sigma the
mechanism reports moves with the bug. The verdict therefore rests on four tests, each with a
reference computed from the **configured knobs alone** (C, eps_cal or the noise multiplier, delta,
the planned cohort, T, the sample rate: the study's own accountant), never from what the mechanism
reports:

``reported-sigma``
    The sigma the mechanism reports, round by round, against the sigma the configuration implies.
    Exact (no statistics): a mechanism that sizes its noise for another cohort says so here.
``measured-noise``
    The noise measured from the released models: the projection of a release onto a held-out
    canary's unit direction (a random direction the mechanism never saw) is the noise along it plus
    the release's signal along it. Under a correct mechanism the sum of squared projections over
    n = (releases x held-out canaries), each divided by the configured SD, is at least chi^2_n
    (signal only adds energy); the test fires when it is significantly *smaller* (one-sided, lower
    tail): the noise added is smaller than configured. It cannot fire falsely above its alpha; it
    loses power when the signal's energy per coordinate rivals the noise's (then a too-small noise
    hides behind the signal: reported as the test's power).
``separation``
    Andrew et al.'s fitted separation of inserted vs held-out canary scores, mu_hat, against the
    formal mu from the configuration (mu-GDP composition over the releases). For Gaussian scores
    with a pooled SD, t = mu_hat / sqrt(1/n_in + 1/n_out) is noncentral-t with n_in + n_out - 2
    degrees of freedom and noncentrality mu / sqrt(1/n_in + 1/n_out); any statistic of a mu-GDP
    release has separation <= mu (Dong, Roth & Su 2022), so the test fires when P(T >= t | mu =
    mu_formal) < alpha. Catches a skipped or misplaced clip (canaries above C enter unclipped) and
    noise too small for the canaries.
``lower-bound``
    The Clopper-Pearson lower bound (a guarantee) against the formal epsilon; fires when the bound
    at confidence 1 - alpha exceeds it. Powerless when its ceiling (every canary classified right)
    is below the formal epsilon: said so, never counted as evidence of correctness.

Family-wise error: the statistical tests share ``ALPHA`` = 0.05 (Bonferroni), so a correct mechanism
is called a violation in at most 5% of runs (measured in ``benchmarks/audit_detection.py``).

Verdict: ``violation`` when any test fires; ``consistent`` when none fires and at least one test had
power >= ``POWER`` against its reference bug (noise at half the configured SD; separation twice the
formal mu; a ceiling above the formal epsilon); ``underpowered`` otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

from privacy.audit.stats import epsilon_lower_bound, max_certifiable_epsilon

ALPHA = 0.05  # family-wise false-positive rate of the statistical tests together
POWER = 0.8  # the power a test needs against its reference bug to make a "consistent" verdict count
VERDICTS = ("consistent", "violation", "underpowered")


def _test(name: str, fired: bool, powered: bool, **detail: object) -> dict:
    return {"test": name, "fired": bool(fired), "powered": bool(powered), **detail}


def reported_sigma_test(reported: Sequence[float], configured: Sequence[float], rtol: float = 1e-6) -> dict:
    """Fires when a release's reported sigma is below the configured one by more than ``rtol`` (relative).

    One-sided: a reported sigma *above* the configured one is more noise than the privacy claim needs
    (e.g. a round in which a client failed: the mean over fewer clients gets a larger sigma_abs for the
    same epsilon), recorded as ``above`` but never a violation.
    """
    r, c = np.asarray(reported, dtype=np.float64), np.asarray(configured, dtype=np.float64)
    if r.shape != c.shape or r.size == 0:
        raise ValueError(f"need one reported and one configured sigma per release, got {r.shape} and {c.shape}")
    if np.any(c <= 0) or not np.all(np.isfinite(c)):
        raise ValueError(f"configured sigmas must be finite and > 0, got {c.tolist()}")
    ratio = r / c
    worst = int(np.argmin(ratio))
    return _test("reported-sigma", bool(ratio[worst] < 1 - rtol), True,
                 worst_release=worst, reported=float(r[worst]), configured=float(c[worst]),
                 ratio=float(ratio[worst]), rtol=rtol, above=int(np.sum(ratio > 1 + rtol)))


def noise_test(projections: np.ndarray, expected_sd: Sequence[float] | np.ndarray, alpha: float) -> dict:
    """Is the noise along held-out canary directions significantly smaller than configured?

    ``projections`` (releases, K_out): each release's change projected on each held-out canary's
    unit direction; ``expected_sd`` (releases,): the configured noise SD of each release.
    """
    p = np.asarray(projections, dtype=np.float64)
    sd = np.asarray(expected_sd, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] != sd.size or p.size == 0:
        raise ValueError(f"projections must be (releases, K_out) with one expected SD per release, "
                         f"got {p.shape} and {sd.shape}")
    if np.any(sd <= 0) or not np.all(np.isfinite(sd)) or not np.all(np.isfinite(p)):
        raise ValueError("expected SDs must be finite and > 0, projections finite")
    n = p.size
    stat = float(np.sum((p / sd[:, None]) ** 2))
    p_value = float(stats.chi2.cdf(stat, n))  # lower tail: too little energy for the configured noise
    q = float(stats.chi2.ppf(alpha, n))
    power = float(stats.chi2.cdf(4 * q, n))  # noise at half the configured SD: stat ~ chi^2_n / 4
    return _test("measured-noise", p_value < alpha, power >= POWER, alpha=alpha, p_value=p_value,
                 measured_over_configured=math.sqrt(stat / n), n=n, power_at_half_noise=power)


def separation_test(scores_in: np.ndarray, scores_out: np.ndarray, mu_formal: float, alpha: float) -> dict:
    """Is the fitted separation mu_hat significantly above the formal mu (noncentral t, one-sided)?"""
    s_in, s_out = np.asarray(scores_in, dtype=np.float64), np.asarray(scores_out, dtype=np.float64)
    if s_in.size < 2 or s_out.size < 2:
        raise ValueError(f"need >= 2 inserted and >= 2 held-out scores, got {s_in.size} and {s_out.size}")
    if not (mu_formal >= 0 and math.isfinite(mu_formal)):
        raise ValueError(f"mu_formal must be finite and >= 0, got {mu_formal}")
    n1, n0 = s_in.size, s_out.size
    df = n1 + n0 - 2
    pooled = math.sqrt(((n1 - 1) * s_in.var(ddof=1) + (n0 - 1) * s_out.var(ddof=1)) / df)
    if pooled == 0:
        return _test("separation", True, True, alpha=alpha, p_value=0.0, mu_hat=math.inf, mu_formal=mu_formal,
                     reason="scores have no spread: the releases carry no noise along the canaries")
    scale = math.sqrt(1 / n1 + 1 / n0)
    mu_hat = (s_in.mean() - s_out.mean()) / pooled
    t = mu_hat / scale
    nc = mu_formal / scale
    p_value = float(stats.nct.sf(t, df, nc)) if nc > 0 else float(stats.t.sf(t, df))
    crit = float(stats.nct.ppf(1 - alpha, df, nc)) if nc > 0 else float(stats.t.ppf(1 - alpha, df))
    alt = max(2 * mu_formal, mu_formal + 1.0)  # the reference bug: twice the separation (at least +1)
    power = float(stats.nct.sf(crit, df, alt / scale))
    return _test("separation", p_value < alpha, power >= POWER, alpha=alpha, p_value=p_value, mu_hat=float(mu_hat),
                 mu_formal=float(mu_formal), n_in=n1, n_out=n0, power_at_reference=power, reference_mu=alt)


def bound_test(scores_in: np.ndarray, scores_out: np.ndarray, eps_formal: float, delta: float, alpha: float,
               rng: np.random.Generator) -> dict:
    """Does the lower bound at confidence 1 - alpha exceed the formal epsilon? Its ceiling says whether it could."""
    res = epsilon_lower_bound(scores_in, scores_out, delta, 1 - alpha, rng)
    ceiling = max_certifiable_epsilon(res["n_in_eval"], res["n_out_eval"], delta, 1 - alpha)
    return _test("lower-bound", res["eps_lower"] > eps_formal, ceiling > eps_formal, alpha=alpha,
                 eps_lower=res["eps_lower"], ceiling=ceiling, eps_formal=float(eps_formal))


def decide(tests: Sequence[Mapping]) -> dict:
    """The verdict from the tests (see the module doc), with the tests behind it."""
    if not tests:
        raise ValueError("a verdict needs at least one test")
    fired = [t["test"] for t in tests if t["fired"]]
    powered = [t["test"] for t in tests if t["powered"]]
    verdict = "violation" if fired else "consistent" if powered else "underpowered"
    return {"verdict": verdict, "fired": fired, "powered": powered, "alpha": ALPHA, "tests": [dict(t) for t in tests]}


def client_level_verdict(scores_in: np.ndarray, scores_out: np.ndarray, projections_out: np.ndarray,
                         configured_sd: Sequence[float], reported_sd: Sequence[float] | None, mu_formal: float,
                         eps_formal: float, delta: float, rng: np.random.Generator) -> dict:
    """The three statistical tests (alpha split equally) and, when the mechanism reports sigma, the exact one.

    ``scores_in`` / ``scores_out``: the all-iterates statistic of the inserted / held-out canaries;
    ``projections_out`` (releases, K_out): the held-out canaries' projections; ``configured_sd``:
    the noise SD of each release from the configuration; ``reported_sd``: what the mechanism reported.
    """
    a = ALPHA / 3
    tests = [noise_test(projections_out, configured_sd, a),
             separation_test(scores_in, scores_out, mu_formal, a),
             bound_test(scores_in, scores_out, eps_formal, delta, a, rng)]
    if reported_sd is not None:
        tests.insert(0, reported_sigma_test(reported_sd, configured_sd))
    return decide(tests)


def loud_line(study: str, runs: Mapping[str, str]) -> str:
    """One line for a sweep's end: the runs whose verdict is ``violation`` ('' when there is none)."""
    bad = sorted(r for r, v in runs.items() if v == "violation")
    if not bad:
        return ""
    return (f"AUDIT VIOLATION in {study}: {len(bad)} run(s) released more than their epsilon allows "
            f"({', '.join(bad)}); see each run's audit.json")
