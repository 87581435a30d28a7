"""The audit's verdict (privacy.audit.verdict) on a simulated Gaussian mechanism with canaries.

A release is w_t - w_{t-1} = signal_t + (sum of the inserted canaries, each clipped to C) / m + noise,
the shape of FL's matched perturbation; the auditor sees only the releases and its own canaries.
The configured SD is the reference; each broken variant changes only what is *added*, as a bug would.
Each rate is measured over fixed seeds, so the tests are deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest

from privacy.audit import ReleaseObserver, make_canaries
from privacy.audit.stats import gdp_epsilon
from privacy.audit.verdict import (
    ALPHA,
    bound_test,
    client_level_verdict,
    decide,
    noise_test,
    reported_sigma_test,
    separation_test,
)

D, K, T, M, C, DELTA = 3000, 100, 8, 20, 1.0, 1e-5
SIGMA = C / M * 1.2  # per-coordinate SD on the release: canary signal C/M over noise SD -> mu = sqrt(T) / 1.2


def _audit(seed: int, noise_factor: float = 1.0, canary_norm: float = C, clip: bool = True,
           signal_norm: float = 0.5) -> dict:
    rng = np.random.default_rng(seed)
    canaries = make_canaries(K, D, canary_norm, rng)
    vecs = canaries.vectors.astype(np.float64)
    if clip:
        vecs = vecs * np.minimum(1.0, C / np.linalg.norm(vecs, axis=1))[:, None]
    inserted_sum = vecs[canaries.inserted].sum(axis=0) / (M + canaries.inserted.sum())
    sigma = SIGMA
    obs = ReleaseObserver(canaries, np.zeros(D))
    w = np.zeros(D)
    for _ in range(T):
        direction = rng.standard_normal(D)
        signal = signal_norm * direction / np.linalg.norm(direction)
        w = w + signal + inserted_sum + rng.normal(0, sigma * noise_factor, D)
        obs.observe(w)
    # The reference: the configured cohort M + K_in and SD; the canary's signal per release is C / (M + K_in).
    m = M + int(canaries.inserted.sum())
    mu = np.sqrt(T) * (C / m) / sigma
    s = obs.scores()["all-iterates"]
    return client_level_verdict(s[canaries.inserted], s[~canaries.inserted], obs.held_out_projections(),
                                [sigma] * T, [sigma] * T, mu, gdp_epsilon(mu, DELTA), DELTA, rng)


def _rate(seeds, **kw) -> float:
    return float(np.mean([_audit(s, **kw)["verdict"] == "violation" for s in seeds]))


def test_a_correct_mechanism_is_consistent_and_flagged_in_at_most_alpha_of_seeds():
    verdicts = [_audit(s) for s in range(60)]
    assert {v["verdict"] for v in verdicts} <= {"consistent", "violation"}
    assert np.mean([v["verdict"] == "violation" for v in verdicts]) <= ALPHA
    assert "measured-noise" in verdicts[0]["powered"]


@pytest.mark.parametrize("bug,kw", [
    ("noise 2x too small", {"noise_factor": 0.5}),
    ("noise 10x too small", {"noise_factor": 0.1}),
    ("clipping skipped (canaries at 2C-10C enter unclipped)", {"canary_norm": 5 * C, "clip": False}),
])
def test_each_broken_mechanism_is_a_violation_in_at_least_95_percent_of_seeds(bug, kw):
    assert _rate(range(20), **kw) >= 0.95, bug


def test_canaries_above_c_that_are_clipped_leave_the_verdict_consistent():
    assert _rate(range(20), canary_norm=5 * C, clip=True) <= ALPHA


def test_reported_sigma_must_be_the_configured_one():
    assert not reported_sigma_test([0.1, 0.1], [0.1, 0.1])["fired"]
    got = reported_sigma_test([0.1, 0.01], [0.1, 0.1])
    assert got["fired"] and got["worst_release"] == 1 and got["ratio"] == pytest.approx(0.1)
    # more noise than configured (a round whose mean had fewer clients) never is a violation, but it is recorded
    above = reported_sigma_test([0.1, 0.2], [0.1, 0.1])
    assert not above["fired"] and above["above"] == 1


def test_noise_test_fires_on_small_noise_and_knows_its_power():
    rng = np.random.default_rng(0)
    ok = noise_test(rng.normal(0, 1, (5, 50)), [1.0] * 5, 0.01)
    low = noise_test(rng.normal(0, 0.5, (5, 50)), [1.0] * 5, 0.01)
    assert not ok["fired"] and low["fired"] and ok["powered"]
    assert low["measured_over_configured"] == pytest.approx(0.5, rel=0.1)
    tiny = noise_test(rng.normal(0, 1, (1, 2)), [1.0], 0.01)
    assert not tiny["powered"]  # 2 projections cannot tell half the noise from the right one


def test_separation_test_against_the_formal_mu():
    rng = np.random.default_rng(1)
    ok = separation_test(rng.normal(2, 1, 200), rng.normal(0, 1, 200), 2.0, 0.01)
    high = separation_test(rng.normal(4, 1, 200), rng.normal(0, 1, 200), 2.0, 0.01)
    assert not ok["fired"] and high["fired"] and ok["powered"]
    assert separation_test(np.ones(5), np.ones(5), 1.0, 0.01)["fired"]  # no spread: no noise at all


def test_the_lower_bound_is_powerless_when_its_ceiling_is_below_the_formal_epsilon():
    rng = np.random.default_rng(2)
    weak = bound_test(rng.normal(3, 1, 50), rng.normal(0, 1, 50), 8.0, DELTA, 0.01, rng)
    assert weak["ceiling"] < 8.0 and not weak["powered"] and not weak["fired"]
    strong = bound_test(rng.normal(60, 1, 2000), rng.normal(0, 1, 2000), 0.5, DELTA, 0.01, rng)
    assert strong["powered"] and strong["fired"]


def test_decide():
    t = lambda name, fired, powered: {"test": name, "fired": fired, "powered": powered}
    assert decide([t("a", False, False), t("b", False, False)])["verdict"] == "underpowered"
    assert decide([t("a", False, True), t("b", False, False)])["verdict"] == "consistent"
    v = decide([t("a", True, False), t("b", False, True)])
    assert v["verdict"] == "violation" and v["fired"] == ["a"]
    with pytest.raises(ValueError):
        decide([])
