"""Model-based attribute inference: hand-checked inference, overfit model beats the prior baseline."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attacks.attribute import attribute_inference_summary, infer_attribute, nearest_candidate, prior_baseline


def test_infer_picks_the_value_that_explains_the_label():
    # y = 2 * x0 + x1 exactly: the unknown x1 is recovered from (x0, y).
    x = np.array([[1.0, 0.0], [0.0, 0.0], [2.0, 0.0]])
    truth = np.array([3.0, 1.0, 2.0])
    y = 2 * x[:, 0] + truth
    cand = np.array([1.0, 2.0, 3.0])
    guess = infer_attribute(lambda v: 2 * v[:, 0] + v[:, 1], x, y, 1, cand)
    np.testing.assert_array_equal(cand[guess], truth)


def test_ties_go_to_the_larger_prior():
    x = np.zeros((2, 2))
    guess = infer_attribute(lambda v: np.zeros(len(v)), x, np.zeros(2), 1, np.array([0.0, 1.0, 2.0]),
                            prior=np.array([0.2, 0.5, 0.3]))
    np.testing.assert_array_equal(guess, [1, 1])


def test_prior_baseline_and_nearest():
    mode, prior = prior_baseline(np.array([0, 2, 2, 1]), 3)
    assert mode == 2 and np.allclose(prior, [0.25, 0.25, 0.5])
    np.testing.assert_array_equal(nearest_candidate(np.array([0.1, 0.9, 0.55]), np.array([0.0, 0.5, 1.0])), [0, 2, 1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(column=5), "column"),
    (dict(candidates=np.array([1.0])), "at least 2"),
    (dict(loss="hinge"), "loss"),
    (dict(prior=np.array([0.5, 0.6])), "prior"),
])
def test_bad_input_is_named(kwargs, match):
    args = dict(predict=lambda v: v[:, 0], x=np.zeros((2, 2)), y=np.zeros(2), column=1,
                candidates=np.array([0.0, 1.0]))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        infer_attribute(**args)


def test_overfit_regressor_reveals_members_attribute_beyond_the_prior():
    # The label does not depend on the attribute in the population (y is noise), so only a
    # model that memorized the members' (x, y) pairs lets the attack beat the prior.
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    cand = np.linspace(0.0, 1.0, 5)

    def draw(n):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        x[:, 3] = rng.choice(cand, size=n)
        return x, rng.normal(size=n).astype(np.float32)

    members, nonmembers = draw(48), draw(48)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(members[0]), torch.from_numpy(members[1])
    for _ in range(600):
        opt.zero_grad()
        nn.functional.mse_loss(model(xt).squeeze(-1), yt).backward()
        opt.step()

    @torch.no_grad()
    def predict(v):
        return model(torch.from_numpy(v.astype(np.float32))).squeeze(-1).numpy()

    res = attribute_inference_summary(predict, members, nonmembers, draw(200)[0][:, 3], 3, cand)
    assert res["member_accuracy"] > res["baseline_accuracy"] + 0.25, res
    assert res["membership_advantage"] > 0.2, res
    assert res["n_members"] == 48 and res["num_candidates"] == 5
