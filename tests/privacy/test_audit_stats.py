"""privacy.audit.stats: hand cases, an independent integration, and the Gaussian mechanism with known epsilon."""

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from privacy.audit.stats import (
    clopper_pearson,
    epsilon_lower_bound,
    gaussian_pair_epsilon,
    gdp_epsilon,
    max_certifiable_epsilon,
    point_estimate,
)

DELTA = 1e-5


def mu_for(eps: float) -> float:
    return optimize.brentq(lambda m: gdp_epsilon(m, DELTA) - eps, 1e-3, 20)


def gaussian_mechanism(mu: float, n: int, rng: np.random.Generator, noise_scale: float = 1.0):
    """n releases with the canary present (sensitivity mu, noise SD 1) and n without: M(b) = b mu + N(0, 1)."""
    return mu + noise_scale * rng.standard_normal(n), noise_scale * rng.standard_normal(n)


def test_clopper_pearson_hand_cases():
    # k = 0: upper bound solves (1 - p)^n = alpha; k = n: lower bound solves p^n = alpha.
    lo, hi = clopper_pearson(0, 10, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.05 ** (1 / 10))
    lo, hi = clopper_pearson(10, 10, 0.05)
    assert lo == pytest.approx(0.05 ** (1 / 10)) and hi == 1.0
    lo, hi = clopper_pearson(5, 10, 0.025)
    assert lo < 0.5 < hi
    with pytest.raises(ValueError, match="k must be"):
        clopper_pearson(11, 10, 0.05)
    with pytest.raises(ValueError, match="alpha"):
        clopper_pearson(1, 10, 0.0)


def test_pair_epsilon_equals_gdp_for_equal_variances():
    for mu in (0.3, 1.0, 2.5):
        assert gaussian_pair_epsilon(0.0, 2.0, 2.0 * mu, 2.0, DELTA) == pytest.approx(gdp_epsilon(mu, DELTA), rel=1e-6)


def test_pair_epsilon_unequal_variances_matches_numerical_integration():
    m0, s0, m1, s1 = 0.0, 1.0, 1.5, 1.4
    eps = gaussian_pair_epsilon(m0, s0, m1, s1, 1e-3)

    def hockey(pa, pb):  # delta(eps) = int max(0, pa - e^eps pb)
        f = lambda x: max(0.0, pa(x) - math.exp(eps) * pb(x))
        return integrate.quad(f, -40, 40, limit=400, points=[-5, 0, 5])[0]

    p0, p1 = stats.norm(m0, s0).pdf, stats.norm(m1, s1).pdf
    assert max(hockey(p1, p0), hockey(p0, p1)) == pytest.approx(1e-3, rel=1e-3)


def test_bad_inputs_fail_with_a_clear_message():
    with pytest.raises(ValueError, match="delta"):
        gdp_epsilon(1.0, 0.0)
    with pytest.raises(ValueError, match="at least 2"):
        point_estimate(np.array([1.0]), np.array([0.0, 1.0]), DELTA)
    with pytest.raises(ValueError, match="finite"):
        epsilon_lower_bound(np.array([1.0, np.nan]), np.array([0.0, 1.0]), DELTA)
    with pytest.raises(ValueError, match="zero spread"):
        point_estimate(np.ones(5), np.zeros(5), DELTA)


@pytest.mark.parametrize("eps_true", [1.0, 2.0, 4.0, 8.0])
def test_point_estimate_within_25_percent_of_the_exact_epsilon(eps_true):
    # Strongest threat model: the adversary sees the mechanism's output itself.
    rng = np.random.default_rng(int(eps_true * 10))
    s_in, s_out = gaussian_mechanism(mu_for(eps_true), 20_000, rng)
    est = point_estimate(s_in, s_out, DELTA)["eps_point"]
    assert abs(est - eps_true) <= 0.25 * eps_true, (est, eps_true)


def test_lower_bound_holds_at_the_stated_confidence_over_repeats():
    rng = np.random.default_rng(7)
    eps_true, repeats = 4.0, 60
    mu = mu_for(eps_true)
    bounds = []
    for _ in range(repeats):
        s_in, s_out = gaussian_mechanism(mu, 1000, rng)
        bounds.append(epsilon_lower_bound(s_in, s_out, DELTA, confidence=0.95, rng=rng)["eps_lower"])
    bounds = np.array(bounds)
    assert np.mean(bounds > eps_true) <= 0.05
    # Not vacuous: the bound finds real leakage in most repeats.
    assert np.median(bounds) > 0.5


def test_broken_mechanism_noise_ten_times_too_small_is_caught():
    claimed = 1.0
    rng = np.random.default_rng(3)
    s_in, s_out = gaussian_mechanism(mu_for(claimed), 500, rng, noise_scale=0.1)
    res = epsilon_lower_bound(s_in, s_out, DELTA, 0.95, rng)
    assert res["eps_lower"] > claimed
    # ... while the correct mechanism with the same canaries is not flagged.
    s_in, s_out = gaussian_mechanism(mu_for(claimed), 500, rng)
    assert epsilon_lower_bound(s_in, s_out, DELTA, 0.95, rng)["eps_lower"] < claimed


def test_max_certifiable_epsilon_limits_the_bound():
    cap = max_certifiable_epsilon(50, 50, DELTA)
    rng = np.random.default_rng(0)
    s_in, s_out = gaussian_mechanism(100.0, 100, rng)  # perfectly separable
    assert epsilon_lower_bound(s_in, s_out, DELTA, rng=rng)["eps_lower"] == pytest.approx(cap)


def test_format_eps_for_tables():
    from privacy.audit.stats import EPS_CAP, format_eps, gdp_epsilon

    assert format_eps(None) == "n/a" and format_eps(None, "> 500") == "> 500"
    assert format_eps(float("inf")) == "inf"
    assert format_eps(1.23456) == "1.23" and format_eps(0.0) == "0"
    assert gdp_epsilon(1e6, 1e-5) == EPS_CAP  # the inversion's cap reads as a bound, not a value
    assert format_eps(gdp_epsilon(1e6, 1e-5)) == "> 500" and format_eps(499.0) == "499"
