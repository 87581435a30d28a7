"""attacks.stats: mean, sample SD and Student-t interval over seeds, checked against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attacks.stats import summarize_over_seeds


@pytest.mark.parametrize("values", [[1.0, 2.0, 4.0, 7.0], [0.31, 0.29], [5.0, 5.0, 5.0]])
def test_matches_scipy_t_interval(values: list[float]) -> None:
    s = summarize_over_seeds(values)
    mean = float(np.mean(values))
    sem = float(stats.sem(values))
    if sem == 0.0:
        low, high = mean, mean
    else:
        low, high = stats.t.interval(0.95, df=len(values) - 1, loc=mean, scale=sem)
    assert s.n == len(values)
    assert s.mean == pytest.approx(mean)
    assert s.sd == pytest.approx(float(np.std(values, ddof=1)))
    assert (s.ci95_low, s.ci95_high) == (pytest.approx(low), pytest.approx(high))


def test_hand_computed_two_seeds() -> None:
    # mean 2, sd sqrt(2), half-width t_{0.975,1} * sqrt(2)/sqrt(2) = 12.7062
    s = summarize_over_seeds([1.0, 3.0])
    assert s.sd == pytest.approx(math.sqrt(2.0))
    assert s.ci95_high - s.mean == pytest.approx(12.7062047, rel=1e-6)
    assert s.as_dict("ssim_") == {
        "ssim_mean": 2.0, "ssim_sd": s.sd, "ssim_ci95_low": s.ci95_low, "ssim_ci95_high": s.ci95_high, "ssim_n": 2,
    }  # fmt: skip


def test_single_seed_warns_and_gives_nan() -> None:
    with pytest.warns(UserWarning, match="one seed"):
        s = summarize_over_seeds([0.5])
    assert s.mean == 0.5 and math.isnan(s.sd) and math.isnan(s.ci95_low) and s.n == 1


@pytest.mark.parametrize(
    ("values", "confidence", "match"),
    [([], 0.95, "values"), ([1.0, math.nan], 0.95, "values"), ([1.0, 2.0], 1.0, "confidence")],
)
def test_bad_input_raises(values: list[float], confidence: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        summarize_over_seeds(values, confidence)
