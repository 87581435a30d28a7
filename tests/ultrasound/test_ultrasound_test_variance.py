"""Test-set sampling errors of the ultrasound results (flower_apps/ultrasound/sampling_variance.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from flower_apps.ultrasound import sampling_variance as tv


def test_hanley_mcneil_by_hand():
    # A = 0.8, 10 positives, 20 negatives: Q1 = 0.8 / 1.2, Q2 = 2 * 0.64 / 1.8 (Hanley & McNeil 1982, eq. 2)
    q1, q2 = 0.8 / 1.2, 1.28 / 1.8
    var = (0.8 * 0.2 + 9 * (q1 - 0.64) + 19 * (q2 - 0.64)) / 200
    assert tv.hanley_mcneil_se(0.8, 10, 20) == pytest.approx(math.sqrt(var), rel=1e-12)
    assert tv.hanley_mcneil_se(0.8, 10, 20) == pytest.approx(0.0936, abs=1e-4)
    assert tv.hanley_mcneil_se(1.0, 10, 20) == 0.0  # a perfect ranking: no spread left in this model


@pytest.mark.parametrize("n_pos, n_neg, kind, shift", [
    (65, 13, "normal", 1.8), (65, 13, "normal", 1.0), (65, 13, "normal", 2.5), (13, 65, "normal", 1.8),
    (44, 21, "normal", 1.5), (65, 13, "exponential", 4.0), (13, 65, "exponential", 4.0)])
def test_auc_se_covers_the_spread_of_auc_over_test_sets(n_pos, n_neg, kind, shift):
    """The AUC of one scorer over 1,000 fresh test sets of the BUSI split's size: auc_se is at least their SD
    (and at most 1.6x it); plain Hanley-McNeil is exact for exponential scores but too small for binormal
    scores with 13 negatives."""
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(n_pos), np.zeros(n_neg)]
    aucs = []
    for _ in range(1000):
        if kind == "normal":
            scores = np.r_[rng.normal(shift, 1.0, n_pos), rng.normal(0.0, 1.0, n_neg)]
        else:
            scores = np.r_[rng.exponential(shift, n_pos), rng.exponential(1.0, n_neg)]
        aucs.append(roc_auc_score(y, scores))
    sd, mean = float(np.std(aucs, ddof=1)), float(np.mean(aucs))
    assert 0.97 * sd <= tv.auc_se(mean, n_pos, n_neg) <= 1.6 * sd
    if kind == "exponential":
        assert tv.hanley_mcneil_se(mean, n_pos, n_neg) == pytest.approx(sd, rel=0.1)
    if (n_pos, n_neg, kind, shift) == (65, 13, "normal", 1.8):
        assert tv.hanley_mcneil_se(mean, n_pos, n_neg) < 0.85 * sd  # why auc_se takes the larger orientation


def test_accuracy_se_and_counts():
    assert tv.accuracy_se(70, 78) == pytest.approx(math.sqrt((70 / 78) * (8 / 78) / 78))
    assert tv.binary_counts([[7, 6], [3, 62]]) == (69, 65, 13)  # rows: true class; class 1 = positive
    with pytest.raises(ValueError, match="correct <= n"):
        tv.accuracy_se(5, 4)
    with pytest.raises(ValueError, match="2x2"):
        tv.binary_counts([[1, 2, 3]])
    with pytest.raises(ValueError, match="each class"):
        tv.hanley_mcneil_se(0.9, 0, 13)


def test_combine_adds_the_shared_test_sets_error_undivided_by_the_seeds():
    cell = tv.combine([0.88, 0.92, 0.90], [0.04, 0.04, 0.04])
    z = 1.959963984540054
    s2 = np.var([0.88, 0.92, 0.90], ddof=1)
    assert cell.training[1] - cell.mean == pytest.approx(z * math.sqrt(s2 / 3))
    assert cell.with_test[1] - cell.mean == pytest.approx(z * math.sqrt(s2 / 3 + 0.04 ** 2))
    assert cell.test_se == pytest.approx(0.04)
    # more seeds shrink the training term only: with a shared test set the interval never gets below +- z SE
    many = tv.combine([0.90] * 100, [0.04] * 100)
    assert many.with_test[1] - many.mean == pytest.approx(z * 0.04)
    with pytest.raises(ValueError, match="one SE per value"):
        tv.combine([0.9], [])


def test_run_ses_on_a_kept_summary_shape():
    s = {"confusion": [[7, 6], [3, 62]], "test_auc": 0.879}
    out = tv.run_ses(s)
    assert out["accuracy"] == pytest.approx(tv.accuracy_se(69, 78))
    assert out["auc"] == pytest.approx(tv.hanley_mcneil_se(0.879, 13, 65))  # the larger orientation here
    three = tv.run_ses({"confusion": [[5, 1, 0], [1, 30, 2], [0, 3, 20]], "test_auc": 0.9})
    assert three["auc"] is None and three["accuracy"] > 0  # macro one-vs-rest AUC: not computable from what is kept
