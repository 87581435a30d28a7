"""The one-run example-level audit (Steinke et al. 2023): hand-computed cases, validity, power, a caught bug."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from scipy import stats

from privacy.audit.example_level import (
    EPS_MAX,
    audit_from_scores,
    dirac_canaries,
    dirac_scores,
    epsilon_lower_bound,
    gaussian_fit_epsilon,
    guesses,
    inclusion_bits,
    k_choices,
    p_value,
    point_estimate,
)

DELTA = 1e-5


def exact_gaussian_epsilon(noise_multiplier: float, steps: int, delta: float) -> float:
    """Independent computation: dp-accounting's PLD of `steps` Gaussian releases (no subsampling)."""
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier), steps)
    return float(acc.get_epsilon(delta))


def dpsgd_like_audit(noise_multiplier: float, *, seed: int, m: int = 1000, steps: int = 4, others: int = 16,
                     dim: int = 1200, clip_norm: float = 1.0):
    """Full-batch DP-SGD on a linear model, white box: each step releases the sum of clipped per-example
    gradients (m Dirac canaries, each in with probability 1/2, plus `others` random examples) + N(0, (z C)^2 I).
    The auditor scores each canary by <canary, sum of the released noisy gradients>."""
    rng = np.random.default_rng(seed)
    canaries = dirac_canaries(m, dim, clip_norm, rng)
    included = inclusion_bits(m, rng)
    released = np.zeros(dim)
    for _ in range(steps):
        g = rng.normal(size=(others, dim))
        g *= np.minimum(1.0, clip_norm / np.linalg.norm(g, axis=1, keepdims=True))  # clip like DP-SGD
        released += g.sum(0) + canaries[included].sum(0) + rng.normal(scale=noise_multiplier * clip_norm, size=dim)
    return audit_from_scores(dirac_scores(canaries, released), included, DELTA)


# ----------------------------------------------------------------------------- hand-computed cases
def test_all_correct_bound_is_the_binomial_tail_inverse():
    # delta = 0, r = v = 10: P[Bin(10, q) >= 10] = q^10 = 0.05  ->  q = 0.05^(1/10), eps = logit(q)
    q = 0.05 ** 0.1
    assert epsilon_lower_bound(10, 10, 10, 0.0, 0.95) == pytest.approx(math.log(q / (1 - q)), abs=1e-5)


def test_p_value_without_delta_is_the_binomial_tail_and_delta_only_adds():
    q = 1 / (1 + math.exp(-1.0))
    assert p_value(100, 40, 30, 1.0, 0.0) == pytest.approx(stats.binom.sf(29, 40, q))
    # the delta term: 2 m delta * max_i P[v - i <= B < v] / i  (paper's Algorithm 3), here by brute force
    pmf = stats.binom.pmf(np.arange(41), 40, q)
    alpha = max(pmf[30 - i:30].sum() / i for i in range(1, 31))
    assert p_value(100, 40, 30, 1.0, 1e-3) == pytest.approx(stats.binom.sf(29, 40, q) + alpha * 1e-3 * 200)
    assert epsilon_lower_bound(100, 40, 30, 1e-3) < epsilon_lower_bound(100, 40, 30, 0.0)


def test_chance_level_guessing_gives_no_bound_and_bounds_grow_with_correct_guesses():
    assert epsilon_lower_bound(1000, 100, 50, DELTA) == 0.0
    b = [epsilon_lower_bound(1000, 100, v, DELTA) for v in (60, 70, 80, 90, 100)]
    assert b == sorted(b) and b[0] > 0 and b[-1] < EPS_MAX


def test_guesses_and_point_estimate_tiny_case():
    g = guesses(np.array([0.3, -1.0, 2.0, 0.1, 5.0]), k_plus=2, k_minus=1)
    assert g.tolist() == [0, -1, 1, 0, 1]
    assert point_estimate(0, 0) == 0.0
    assert point_estimate(9, 9) == pytest.approx(math.log(9.5 / 0.5))
    assert point_estimate(10, 5) == 0.0
    assert k_choices(100) == [(5, 5), (10, 10), (20, 20), (50, 50)]


@pytest.mark.parametrize("bad", [
    lambda: p_value(10, 11, 5, 1.0, 0.0),  # r > m
    lambda: p_value(10, 5, 6, 1.0, 0.0),  # v > r
    lambda: p_value(10, 5, 3, -1.0, 0.0),  # eps < 0
    lambda: epsilon_lower_bound(10, 5, 3, 1.0),  # delta = 1
    lambda: epsilon_lower_bound(10, 5, 3, 0.0, confidence=1.0),
    lambda: audit_from_scores(np.zeros(4), np.array([1, 0, 1, 0]), DELTA),  # bits not booleans
    lambda: audit_from_scores(np.array([0.0, np.nan, 1.0]), np.array([True, False, True]), DELTA),
    lambda: guesses(np.zeros(4), 3, 2),  # k+ + k- > m
    lambda: dirac_canaries(5, 4, 1.0, np.random.default_rng(0)),  # more canaries than directions
])
def test_bad_input_is_refused_with_a_reason(bad):
    with pytest.raises((ValueError, TypeError)):
        bad()


def test_bonferroni_over_choices_costs_confidence():
    rng = np.random.default_rng(0)
    inc = inclusion_bits(200, rng)
    scores = inc + rng.normal(scale=0.5, size=200)
    one = audit_from_scores(scores, inc, DELTA, choices=[(20, 20)])
    four = audit_from_scores(scores, inc, DELTA, choices=[(20, 20), (5, 5), (10, 10), (50, 50)])
    assert four.choices_tried == 4 and one.choices_tried == 1
    same = audit_from_scores(scores, inc, DELTA, choices=[(20, 20)] * 4)  # same counts, stricter level
    assert same.eps_lower < one.eps_lower and same.correct == one.correct
    noise = audit_from_scores(rng.normal(size=200), inc, DELTA)  # no bound anywhere: the most guesses shown
    assert noise.eps_lower == 0.0 and noise.guesses == 200


# ----------------------------------------------------------------------------- the proofs
def test_lower_bound_is_valid_and_nontrivial_on_a_gaussian_mechanism_with_known_epsilon():
    z, steps = 2.0, 4  # 4 full-batch steps at z = 2 compose to one Gaussian at z = 1
    truth = exact_gaussian_epsilon(z, steps, DELTA)
    assert truth == pytest.approx(exact_gaussian_epsilon(z / math.sqrt(steps), 1, DELTA), rel=1e-2)
    audits = [dpsgd_like_audit(z, seed=s, steps=steps) for s in range(12)]
    below = sum(a.eps_lower < truth for a in audits)
    assert below >= math.ceil(0.95 * len(audits))  # the stated confidence (95%), at least
    assert np.median([a.eps_lower for a in audits]) > 0.25 * truth  # non-trivial (about 0.35x here)
    # the separately labelled Gaussian-fit point estimate is tight for Dirac canaries
    assert np.median([a.eps_gaussian_fit for a in audits]) == pytest.approx(truth, rel=0.25)


@pytest.mark.parametrize("z", [0.6, 3.0])  # epsilon about 8 and about 1.3
def test_gaussian_fit_point_estimate_is_within_25_percent(z):
    truth = exact_gaussian_epsilon(z, 1, DELTA)
    assert 1.0 <= truth <= 8.5
    est = np.median([dpsgd_like_audit(z, seed=100 + s, steps=1, m=1500, dim=1600).eps_gaussian_fit
                     for s in range(3)])
    assert est == pytest.approx(truth, rel=0.25)


def test_noise_ten_times_too_small_is_caught():
    z_claimed = 3.0
    eps_claimed = exact_gaussian_epsilon(z_claimed, 1, DELTA)  # about 1.27: what the accountant would report
    broken = dpsgd_like_audit(z_claimed / 10, seed=7, steps=1)
    assert broken.eps_lower > eps_claimed  # the lower bound exceeds the claim: a bug is proven at 95%
    honest = dpsgd_like_audit(z_claimed, seed=7, steps=1)
    assert honest.eps_lower < eps_claimed


def test_shuffled_scores_carry_no_signal():
    # scores independent of membership: the bound stays at (or near) zero in every repeat
    rng = np.random.default_rng(3)
    for _ in range(5):
        inc = inclusion_bits(500, rng)
        a = audit_from_scores(rng.normal(size=500), inc, DELTA)
        assert a.eps_lower < 0.3
    assert math.isnan(gaussian_fit_epsilon(np.r_[np.ones(3), np.zeros(3)], np.array([1, 1, 1, 0, 0, 0], bool), DELTA))
