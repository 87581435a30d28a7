"""Membership features, ROC helpers and model_outputs: hand-computed cases and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from attacks.membership import attack_auc, confidence, cross_entropy_loss, model_outputs, prediction_entropy, tpr_at_fpr
from attacks.membership.features import fit_standardizer, standardize

PROBS = np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]])
LABELS = np.array([0, 1])


def test_features_hand_computed() -> None:
    np.testing.assert_allclose(confidence(PROBS), [0.7, 0.5])
    np.testing.assert_allclose(cross_entropy_loss(PROBS, LABELS), [-math.log(0.7), -math.log(0.5)], rtol=1e-9)
    h0 = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    # The zero probability contributes 0 * log(1e-12) = 0.
    np.testing.assert_allclose(prediction_entropy(PROBS), [h0, math.log(2.0)], rtol=1e-9)


def test_loss_of_zero_probability_is_finite() -> None:
    loss = cross_entropy_loss(PROBS, np.array([0, 2]))
    assert loss[1] == pytest.approx(-math.log(1e-12))


@pytest.mark.parametrize(
    ("probs", "labels", "match"),
    [
        (np.array([0.5, 0.5]), np.array([0]), "probs"),
        (np.array([[0.6, 0.6]]), np.array([0]), "probs"),
        (np.array([[1.2, -0.2]]), np.array([0]), "probs"),
        (np.array([[0.5, 0.5]]), np.array([2]), "labels"),
        (np.array([[0.5, 0.5]]), np.array([0, 1]), "labels"),
        (np.array([[0.5, 0.5]]), None, "labels"),
    ],
)
def test_bad_input_raises(probs: np.ndarray, labels: np.ndarray | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cross_entropy_loss(probs, labels)


def test_standardizer_uses_given_statistics() -> None:
    mean, sd = fit_standardizer(np.array([1.0, 3.0]))
    assert (mean, sd) == (2.0, 1.0)
    np.testing.assert_allclose(standardize(np.array([2.0, 5.0]), mean, sd), [0.0, 3.0])
    with pytest.warns(UserWarning, match="constant"):
        assert fit_standardizer(np.array([4.0, 4.0])) == (4.0, 1.0)


# Members 0.9, 0.8, 0.4, 0.3; non-members 0.85, 0.2, 0.1, 0.05.
IS_MEMBER = np.array([1, 1, 1, 1, 0, 0, 0, 0])
SCORES = np.array([0.9, 0.8, 0.4, 0.3, 0.85, 0.2, 0.1, 0.05])


def test_auc_hand_computed() -> None:
    # Pairs won by members: 4 + 3 + 3 + 3 = 13 of 16.
    assert attack_auc(IS_MEMBER, SCORES) == pytest.approx(13 / 16)


def test_tpr_at_fpr_is_conservative_step_interpolation() -> None:
    # ROC points: (0, 0.25) then (0.25, 1.0). Linear interpolation at FPR 0.1 would give 0.55.
    assert tpr_at_fpr(IS_MEMBER, SCORES, 0.0) == 0.25
    assert tpr_at_fpr(IS_MEMBER, SCORES, 0.1) == 0.25
    assert tpr_at_fpr(IS_MEMBER, SCORES, 0.25) == 1.0
    with pytest.raises(ValueError, match="fpr"):
        tpr_at_fpr(IS_MEMBER, SCORES, 1.5)
    with pytest.raises(ValueError, match="is_member"):
        tpr_at_fpr(np.ones(8, int), SCORES, 0.1)


def test_model_outputs_softmax_eval_mode_and_batching() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    model.train()
    x = torch.randn((10, 5), generator=torch.Generator().manual_seed(1))
    a = model_outputs(model, x, batch_size=3)
    b = model_outputs(model, x, batch_size=10)
    assert model.training  # mode restored
    model.eval()
    with torch.no_grad():
        expected = torch.softmax(model(x).double(), dim=1).numpy()
    assert a.shape == (10, 3) and a.dtype == np.float64
    np.testing.assert_allclose(a, expected, rtol=1e-6)  # dropout was off
    np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(a.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="batch_size"):
        model_outputs(model, x, batch_size=0)
