import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privacy.mechanisms import calibrate_sigma_abs, clip_by_l2, gaussian_noise_like, global_l2_norm, sensitivity


def test_clip_hand_computed():
    x = [np.array([3.0, 0.0]), np.array([[4.0]])]  # norm 5
    clipped, norm, was = clip_by_l2(x, 1.0)
    assert norm == pytest.approx(5.0)
    assert was
    np.testing.assert_allclose(clipped[0], [0.6, 0.0])
    np.testing.assert_allclose(clipped[1], [[0.8]])
    same, norm2, was2 = clip_by_l2(x, 10.0)
    assert not was2 and norm2 == pytest.approx(5.0)
    np.testing.assert_array_equal(same[0], x[0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=20), st.floats(1e-3, 1e3))
def test_clip_property_norm_bounded_and_direction_kept(values, c):
    x = [np.array(values, dtype=np.float64)]
    clipped, norm, was = clip_by_l2(x, c)
    assert global_l2_norm(clipped) <= c * (1 + 1e-9) + 1e-12
    if norm > 0:
        # same direction: clipped = s * x with 0 < s <= 1
        s = global_l2_norm(clipped) / norm
        np.testing.assert_allclose(clipped[0], x[0] * s, rtol=1e-9, atol=1e-12)
        assert s <= 1 + 1e-12
    assert was == (norm > c)


def test_clip_rejects_bad_norm():
    with pytest.raises(ValueError, match="clip_norm must be > 0"):
        clip_by_l2([np.ones(2)], 0.0)


def test_sigma_abs_formula_hand_computed():
    # C=1, N=100, eps=2, delta=1e-5: (1/100) * sqrt(2 ln(125000)) / 2
    expected = 0.01 * math.sqrt(2 * math.log(1.25e5)) / 2
    assert calibrate_sigma_abs(1.0, 100, 2.0, 1e-5) == pytest.approx(expected)
    assert expected == pytest.approx(0.024224, rel=1e-4)


@pytest.mark.parametrize("bad", [dict(clip_norm=0), dict(num_clients=0), dict(eps_cal=0), dict(delta_cal=1.5)])
def test_sigma_abs_rejects_bad_input(bad):
    args = dict(clip_norm=1.0, num_clients=10, eps_cal=1.0, delta_cal=1e-5) | bad
    with pytest.raises(ValueError, match=list(bad)[0]):
        calibrate_sigma_abs(**args)


def test_sensitivity():
    assert sensitivity("fl", 1.0, 100) == pytest.approx(0.02)
    assert sensitivity("sequential-dfl", 1.0, 100) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="framework"):
        sensitivity("gossip", 1.0, 100)


def test_noise_sd_matches_sigma_statistically():
    """Chi-square test of the sample variance: n s^2 / sigma^2 ~ chi2(n)."""
    sigma = 0.0242
    arrays = [np.zeros((200, 100), dtype=np.float32), np.zeros(5000, dtype=np.float32)]
    z = np.concatenate([a.ravel() for a in gaussian_noise_like(arrays, sigma, np.random.default_rng(7))]).astype(float)
    n = z.size
    stat = np.sum(z ** 2) / sigma ** 2
    p = 2 * min(stats.chi2.cdf(stat, n), stats.chi2.sf(stat, n))
    assert p > 1e-3, f"sample SD {z.std():.6f} inconsistent with sigma {sigma}"
    assert abs(z.mean()) < 5 * sigma / math.sqrt(n)
    # A 5% mis-scaled sigma must be rejected by the same test (the test has power).
    stat_wrong = np.sum(z ** 2) / (1.05 * sigma) ** 2
    assert 2 * min(stats.chi2.cdf(stat_wrong, n), stats.chi2.sf(stat_wrong, n)) < 1e-6


def test_noise_is_reproducible_per_seed():
    a = gaussian_noise_like([np.zeros(10)], 1.0, np.random.default_rng(3))
    b = gaussian_noise_like([np.zeros(10)], 1.0, np.random.default_rng(3))
    np.testing.assert_array_equal(a[0], b[0])
