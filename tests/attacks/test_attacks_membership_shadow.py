"""Shadow-model membership inference and the loss-threshold baseline, end to end on tiny models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attacks.membership import (
    CLASSIFIERS,
    FEATURES,
    LabeledOutputs,
    ShadowAttackData,
    balance,
    best_loss_threshold,
    model_outputs,
    run_loss_threshold,
    run_shadow_mia,
)

DIM, K, N_TRAIN = 20, 10, 300


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Tiny ops: intra-op threads only add synchronization (and stall on a busy CI core).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _random_set(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Random inputs with random labels: the only way to fit them is to memorize.
    x = torch.from_numpy(rng.normal(size=(n, DIM)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, K, size=n))
    return x, y


def _overfit_mlp(x: torch.Tensor, y: torch.Tensor, seed: int, epochs: int = 300) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(DIM, 128), nn.ReLU(), nn.Linear(128, K))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def _outputs(model: nn.Module, xy: tuple[torch.Tensor, torch.Tensor]) -> LabeledOutputs:
    out = LabeledOutputs.from_model(model, xy[0], xy[1], batch_size=128)
    np.testing.assert_array_equal(out.probs, model_outputs(model, xy[0]))
    return out


@pytest.fixture(scope="module")
def mia_sets() -> dict[str, LabeledOutputs]:
    rng = np.random.default_rng(0)
    shadow_in, shadow_out, target_in, target_out, fresh_a, fresh_b = (_random_set(rng, N_TRAIN) for _ in range(6))
    shadow = _overfit_mlp(*shadow_in, seed=1)
    target = _overfit_mlp(*target_in, seed=2)
    return {
        "shadow_in": _outputs(shadow, shadow_in),
        "shadow_out": _outputs(shadow, shadow_out),
        "target_in": _outputs(target, target_in),
        "target_out": _outputs(target, target_out),
        # Two sets the target never saw: "members" and "non-members" are exchangeable.
        "fresh_a": _outputs(target, fresh_a),
        "fresh_b": _outputs(target, fresh_b),
    }


def test_overfit_model_leaks_membership(mia_sets: dict[str, LabeledOutputs]) -> None:
    s = mia_sets
    data = ShadowAttackData(s["shadow_in"], s["shadow_out"], s["target_in"], s["target_out"])
    rows = run_shadow_mia(data, seed=0)
    assert {(r["feature"], r["classifier"]) for r in rows} == {(f, c) for f in FEATURES for c in CLASSIFIERS}
    for r in rows:
        assert r["auc"] > 0.7, r
        assert r["n_target_members"] == r["n_target_nonmembers"] == N_TRAIN
        assert 0.0 <= r["tpr_at_fpr_0.001"] <= r["tpr_at_fpr_0.01"] <= 1.0
    loss_rows = [r for r in rows if r["feature"] == "loss"]
    assert all(r["auc"] > 0.9 and r["accuracy"] > 0.75 for r in loss_rows), loss_rows
    base = run_loss_threshold(data, seed=0)
    assert base["auc"] > 0.9 and base["accuracy"] > 0.75, base


def test_no_membership_signal_gives_chance_auc(mia_sets: dict[str, LabeledOutputs]) -> None:
    s = mia_sets
    # The attack model is trained on a leaking shadow pair but evaluated on exchangeable sets.
    data = ShadowAttackData(s["shadow_in"], s["shadow_out"], s["fresh_a"], s["fresh_b"])
    rows = [*run_shadow_mia(data, seed=0), run_loss_threshold(data, seed=0)]
    for r in rows:
        # AUC standard error at 300 vs 300 is about 0.024.
        assert abs(r["auc"] - 0.5) < 0.1, r


def test_balance_subsamples_equal_counts_deterministically(mia_sets: dict[str, LabeledOutputs]) -> None:
    s = mia_sets
    big = LabeledOutputs(np.concatenate([s["fresh_a"].probs, s["fresh_b"].probs]),
                         np.concatenate([s["fresh_a"].labels, s["fresh_b"].labels]))  # fmt: skip
    data = ShadowAttackData(big, s["shadow_out"], s["target_in"], big)
    a = balance(data, seed=3, n_shadow=100, n_target=None)
    b = balance(data, seed=3, n_shadow=100, n_target=None)
    c = balance(data, seed=4, n_shadow=100, n_target=None)
    assert a.counts() == {
        "n_shadow_members": 100, "n_shadow_nonmembers": 100, "n_target_members": N_TRAIN, "n_target_nonmembers": N_TRAIN,
    }  # fmt: skip
    np.testing.assert_array_equal(a.shadow_members.probs, b.shadow_members.probs)
    assert not np.array_equal(a.shadow_members.probs, c.shadow_members.probs)
    with pytest.raises(ValueError, match="n_shadow"):
        balance(data, seed=0, n_shadow=N_TRAIN + 1)


def test_best_loss_threshold_hand_case() -> None:
    # Members below 1.0, non-members above: any tau in [0.5, 2.0) separates; the smallest is chosen.
    tau, acc = best_loss_threshold(np.array([0.1, 0.5]), np.array([2.0, 3.0]))
    assert (tau, acc) == (0.5, 1.0)
    tau, acc = best_loss_threshold(np.array([0.1, 2.5]), np.array([2.0, 3.0]))
    assert tau == 0.1 and acc == 0.75


def test_bad_names_raise() -> None:
    p = np.full((4, 2), 0.5)
    part = LabeledOutputs(p, np.array([0, 1, 0, 1]))
    data = ShadowAttackData(part, part, part, part)
    with pytest.raises(ValueError, match="features"):
        run_shadow_mia(data, seed=0, features=("margin",))
    with pytest.raises(ValueError, match="classifiers"):
        run_shadow_mia(data, seed=0, classifiers=("svm",))
    with pytest.raises(ValueError, match="same number of classes"):
        ShadowAttackData(part, part, part, LabeledOutputs(np.full((4, 4), 0.25), np.zeros(4, int)))
