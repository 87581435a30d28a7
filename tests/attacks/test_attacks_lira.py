"""Offline LiRA (Carlini et al. 2022): hand-computed scores, a leaking and a non-leaking target."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attacks.membership import (
    lira_offline_scores,
    logit_confidence,
    model_outputs,
    reference_subsets,
    regression_statistic,
    run_offline_lira,
)

DIM, K = 10, 4


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_scores_hand_computed():
    # OUT stats per candidate: {0, 2} -> mean 1, sample variance 2 (both candidates): pooled SD sqrt(2).
    out = np.array([[0.0, 0.0], [2.0, 2.0]])
    z = lira_offline_scores(np.array([1 + np.sqrt(2), 1.0]), out)
    np.testing.assert_allclose(z, [1.0, 0.0], atol=1e-12)
    # Per-example variance: the second candidate's spread is 4x larger, so the same shift scores half.
    out2 = np.array([[0.0, -1.0], [2.0, 3.0]])
    z2 = lira_offline_scores(np.array([3.0, 3.0]), out2, fix_variance=False)
    np.testing.assert_allclose(z2, [2 / np.sqrt(2), 2 / np.sqrt(8)], atol=1e-12)


def test_logit_confidence_matches_definition_and_stays_finite():
    p = np.array([[0.8, 0.2], [0.25, 0.75], [1.0, 0.0]])
    s = logit_confidence(p, np.array([0, 0, 0]))
    np.testing.assert_allclose(s[:2], [np.log(4.0), np.log(1 / 3)], atol=1e-9)
    assert np.isfinite(s[2]) and s[2] > 20


def test_regression_statistic_prefers_small_errors():
    s = regression_statistic(np.array([1.0, 1.0]), np.array([1.1, 3.0]))
    assert s[0] > s[1]
    with pytest.raises(ValueError, match="equal length"):
        regression_statistic(np.zeros(3), np.zeros(2))


@pytest.mark.parametrize("bad, match", [
    (dict(target_stat=np.zeros(3), out_stats=np.zeros((1, 3))), "at least 2 reference"),
    (dict(target_stat=np.zeros(3), out_stats=np.zeros((2, 4))), "shape"),
    (dict(target_stat=np.array([np.nan]), out_stats=np.zeros((2, 1))), "finite"),
])
def test_scores_reject_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        lira_offline_scores(**bad)


def test_reference_subsets_are_seeded_and_sized():
    a = reference_subsets(100, 4, 0.5, seed=3)
    b = reference_subsets(100, 4, 0.5, seed=3)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert all(len(u) == 50 and len(np.unique(u)) == 50 for u in a)
    assert not np.array_equal(a[0], a[1])
    with pytest.raises(ValueError, match="num_reference"):
        reference_subsets(100, 1, 0.5, seed=0)


def _data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    # Random labels: a model can only fit them by memorizing, so members leak.
    return (torch.from_numpy(rng.normal(size=(n, DIM)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, K, size=n)))


def _fit(x: torch.Tensor, y: torch.Tensor, seed: int, steps: int) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, K))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return m


def _lira(target: nn.Module, x_cand, y_cand, is_member, x_pool, y_pool, steps: int) -> dict:
    return run_offline_lira(
        target, is_member,
        statistic=lambda m: logit_confidence(model_outputs(m, x_cand), y_cand.numpy()),
        train_reference=lambda idx, s: _fit(x_pool[idx], y_pool[idx], s, steps),
        pool_size=len(x_pool), num_reference=4, seed=0)


def test_overfit_model_leaks():
    x_in, y_in = _data(1, 64)
    x_out, y_out = _data(2, 64)
    x_pool, y_pool = _data(3, 128)
    target = _fit(x_in, y_in, 0, 150)
    res = _lira(target, torch.cat([x_in, x_out]), torch.cat([y_in, y_out]), np.r_[np.ones(64), np.zeros(64)],
                x_pool, y_pool, 150)
    assert res["auc"] > 0.8, res
    # 64 non-members: FPR 1 % means zero false positives; some members still score above all of them.
    assert res["tpr_at_fpr_0.01"] > 0.0, res
    assert res["num_reference"] == 4 and res["n_members"] == res["n_nonmembers"] == 64


def test_untrained_model_on_identical_distributions_stays_near_chance():
    x, y = _data(4, 400)
    x_pool, y_pool = _data(5, 64)
    target = _fit(x[:1], y[:1], 0, 0)  # untrained: no example influenced it
    is_member = np.r_[np.ones(200), np.zeros(200)]
    res = _lira(target, x, y, is_member, x_pool, y_pool, 30)
    assert abs(res["auc"] - 0.5) < 0.1, res


def test_statistic_shape_is_checked():
    with pytest.raises(ValueError, match="one value per candidate"):
        run_offline_lira(None, np.array([0, 1]), statistic=lambda m: np.zeros(3),
                         train_reference=lambda i, s: None, pool_size=10)
