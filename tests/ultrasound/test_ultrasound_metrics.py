"""Classification metrics: hand-computed tiny cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flower_apps.ultrasound.metrics import classification_metrics, specificity


def test_binary_hand_case():
    y = np.array([0, 0, 0, 1, 1])
    p1 = np.array([0.1, 0.6, 0.2, 0.8, 0.4])  # predictions 0 1 0 1 0
    m = classification_metrics(y, np.stack([1 - p1, p1], 1))
    assert m["confusion"] == [[2, 1], [1, 1]]
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["specificity"] == pytest.approx(2 / 3)  # TN / (TN + FP), class 1 positive
    # macro precision: class 0 2/3, class 1 1/2; macro recall: 2/3, 1/2; F1 per class 2/3, 1/2
    assert m["precision"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert m["recall"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert m["f1"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    # AUC: positive scores {0.8, 0.4} vs negatives {0.1, 0.6, 0.2}: pairs won 3 + 2 = 5 of 6
    assert m["auc"] == pytest.approx(5 / 6)


def test_three_class_specificity_is_macro_one_vs_rest():
    y = np.array([0, 1, 2, 2])
    pred = np.array([0, 2, 2, 1])
    # class 0: TN 3 FP 0 -> 1; class 1: TN 2 FP 1 -> 2/3; class 2: TN 1 FP 1 -> 1/2
    assert specificity(y, pred, 3) == pytest.approx((1 + 2 / 3 + 1 / 2) / 3)


def test_auc_is_nan_when_a_class_is_absent():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
    m = classification_metrics(np.array([0, 1]), probs)
    assert math.isnan(m["auc"]) and m["accuracy"] == 1.0
    with pytest.raises(ValueError, match="probs"):
        classification_metrics(np.array([0, 1, 1]), probs)
