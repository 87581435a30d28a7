import math

import pytest

from flower_apps.common.stats import summarize
from flower_apps.dfl_dp.metrics import curve_summary, retention_and_degradation, rounds_to_threshold, stability_round


def test_rounds_to_threshold_first_crossing_one_based():
    assert rounds_to_threshold([0.1, 0.5, 0.75, 0.9]) == 3
    assert rounds_to_threshold([0.1, 0.74999]) is None
    assert rounds_to_threshold([0.8]) == 1


def test_stability_round_first_window_within_tolerance():
    curve = [0.1, 0.5, 0.8, 0.900, 0.903, 0.902, 0.904, 0.905, 0.9]
    # window starting at round 4: 0.900..0.905 -> max-min = 0.005 <= 0.005
    assert stability_round(curve) == 4
    assert stability_round([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) is None
    assert stability_round([0.5] * 4) is None  # shorter than the window
    assert stability_round([0.5, 0.5, 0.5, 0.5, 0.506]) is None


def test_retention_and_degradation():
    r, d = retention_and_degradation(0.7383, 0.9212)
    assert r == pytest.approx(80.146, abs=1e-3)
    assert d == pytest.approx(18.29, abs=1e-9)
    with pytest.raises(ValueError):
        retention_and_degradation(0.5, 0.0)


def test_curve_summary():
    s = curve_summary([0.2, 0.8, 0.7])
    assert s == {"final_acc": 0.7, "best_acc": 0.8, "rounds_to_75": 2, "stability_round": None}


def test_seed_summary_t_interval_and_not_reached():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.mean == 3.0 and s.sd == pytest.approx(math.sqrt(2.5))
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)  # t_{0.975, 4}
    assert (s.ci_low, s.ci_high) == pytest.approx((3 - half, 3 + half))
    assert summarize([3, None, 5, None, None]).fmt(1).endswith("(reached 2/5)")
    assert summarize([None] * 5).fmt() == "Not reached (0/5)"
