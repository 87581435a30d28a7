"""Client-level audit: canaries, the cosine statistic on released models, and a simulated DP-FedAvg."""

from collections import OrderedDict

import numpy as np
import pytest

from privacy.audit import (
    CanarySet,
    ReleaseObserver,
    auditor_generator,
    canary_cosines,
    estimate,
    flat_params,
    formal_add_remove_epsilon,
    make_canaries,
    split_like,
)
from privacy.mechanisms import calibrate_sigma_abs
from privacy.randomness import STREAM_MATCHED_PERTURBATION, NoiseSource

DELTA = 1e-5


def test_canaries_have_the_clip_norm_and_half_of_each_group_inserted():
    rng = np.random.default_rng(0)
    groups = np.repeat([0, 1, 2], 6)
    c = make_canaries(18, 40, 0.5, rng, groups=groups)
    np.testing.assert_allclose(np.linalg.norm(c.vectors, axis=1), 0.5)
    for g in (0, 1, 2):
        assert c.inserted[groups == g].sum() == 3
    gram = c.vectors @ c.vectors.T  # orthogonal by default when dim < 100 K
    np.testing.assert_allclose(gram, 0.25 * np.eye(18), atol=1e-12)
    assert c.describe()["num_inserted"] == 9


def test_canary_inputs_are_checked():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="even number"):
        make_canaries(3, 10, 1.0, rng)
    with pytest.raises(ValueError, match="orthogonal"):
        make_canaries(20, 10, 1.0, rng, orthogonal=True)
    with pytest.raises(ValueError, match="exceeds the clip norm"):
        CanarySet(np.ones((2, 4)), np.array([True, False]), 1.0, np.array([-1, -1]))
    with pytest.raises(ValueError, match="group 1 has 1"):
        make_canaries(4, 10, 1.0, rng, groups=np.array([0, 0, 0, 1]))


def test_auditor_randomness_is_not_the_noise_stream(tmp_path):
    f = tmp_path / "seed"
    f.write_text("secret")
    a = auditor_generator(str(f), 1).standard_normal(4)
    np.testing.assert_array_equal(a, auditor_generator(str(f), 1).standard_normal(4))  # seeded: repeatable
    noise = NoiseSource(str(f)).numpy_generator(STREAM_MATCHED_PERTURBATION, 1).standard_normal(4)
    assert not np.allclose(a, noise)
    assert not np.allclose(auditor_generator(None).standard_normal(4), auditor_generator(None).standard_normal(4))


def test_flat_params_round_trip_skips_integer_buffers():
    m = OrderedDict(w=np.arange(6, dtype=np.float32).reshape(2, 3), steps=np.array(5), b=np.ones(2))
    v = flat_params(m)
    assert v.shape == (8,)
    back = split_like(v, m)
    np.testing.assert_array_equal(back["w"], m["w"])
    assert "steps" not in back
    with pytest.raises(ValueError, match="does not fit"):
        split_like(np.zeros(7), m)


def test_cosines_hand_case():
    c = CanarySet(np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([True, False]), 2.0, np.array([-1, -1]))
    np.testing.assert_allclose(canary_cosines(c, np.array([3.0, 4.0])), [0.6, 0.8])
    np.testing.assert_allclose(canary_cosines(c, np.zeros(2)), [0.0, 0.0])


def simulate_dp_fedavg(eps_cal: float, rng: np.random.Generator, *, d=400, k=200, rounds=3, n_real=20, clip=1.0,
                       sized_for: int | None = None):
    """DP-FedAvg (Algorithm 1 of the dfl-dp seed paper) in NumPy with canary clients.

    The noise is sized for ``sized_for`` clients (the broken mechanism: 10x the real cohort).
    Returns the audit result and the add/remove epsilon the mechanism claims for a canary.
    """
    can = make_canaries(k, d, clip, rng)
    m = n_real + int(can.inserted.sum())
    sigma = calibrate_sigma_abs(clip, sized_for or m, eps_cal)
    w = rng.standard_normal(d)
    obs = ReleaseObserver(can, w)
    canary_sum = can.vectors[can.inserted].sum(axis=0)
    for _ in range(rounds):
        real = rng.standard_normal((n_real, d))
        real *= clip / np.linalg.norm(real, axis=1, keepdims=True)
        w = w + (canary_sum + real.sum(axis=0)) / m + rng.normal(0.0, sigma, d)
        obs.observe(w)
    claimed = formal_add_remove_epsilon([clip / calibrate_sigma_abs(clip, m, eps_cal) / m] * rounds, DELTA)
    return estimate(can, obs.scores(), DELTA, 0.95, rng), claimed


def test_simulated_dp_fedavg_audit_stays_below_the_formal_epsilon():
    res, claimed = simulate_dp_fedavg(4.0, np.random.default_rng(11))
    for tm in ("all-iterates", "final-model"):
        r = res[tm]["-1"]
        assert r["eps_lower"] <= claimed
        assert 0 < r["eps_point"] < 2 * claimed  # an estimate: near the claim, no guarantee


def test_noise_sized_for_ten_times_the_cohort_is_caught():
    rng = np.random.default_rng(5)
    res, claimed = simulate_dp_fedavg(1.0, rng, sized_for=10 * 120)
    assert res["all-iterates"]["-1"]["eps_lower"] > claimed


def test_estimate_refuses_unknown_threat_models():
    rng = np.random.default_rng(0)
    c = make_canaries(4, 8, 1.0, rng)
    with pytest.raises(ValueError, match="threat model"):
        estimate(c, {"server": np.zeros(4)}, DELTA)
    with pytest.raises(RuntimeError, match="no released model"):
        ReleaseObserver(c, np.zeros(8)).scores()


def test_canaries_above_the_clip_norm_have_norms_in_their_range_and_uniform_directions():
    from privacy.audit import make_canaries

    rng = np.random.default_rng(3)
    c = make_canaries(200, 500, 2.0, rng, norm_range=(2.0, 10.0))
    assert c.norms.min() >= 4.0 * (1 - 1e-6) and c.norms.max() <= 20.0 * (1 + 1e-6)
    assert c.describe()["norm_range_over_c"] == [2.0, 10.0]
    unit = c.vectors / c.norms[:, None]
    assert abs(float(unit.mean(axis=0) @ unit.mean(axis=0))) < 0.02  # no preferred direction
    with pytest.raises(ValueError, match="norm_range"):
        make_canaries(4, 10, 1.0, rng, norm_range=(3.0, 2.0))
