"""Membership attack runners: hand-computed cases, a memorizing model that must leak, registry contracts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attacks.membership import (
    MEMBERSHIP_ATTACKS,
    LabeledOutputs,
    MembershipAttack,
    MembershipOutputs,
    ShadowAttackData,
    ShadowSets,
    evaluate_scores,
    get_membership_attack,
    modified_entropy,
    prediction_entropy,
    register_membership_attack,
    run_loss_threshold,
    run_membership_attack,
    runners,
    shadow_free_attacks,
)

DIM, K, N_MEMBERS, N_FRESH = 10, 4, 64, 200
SEED = 0


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class FirstInputLogit(nn.Module):
    """Two-class model with logits ``(x[:, 0], 0)``: for label 0 the loss is ``log(1 + exp(-x0))``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x[:, 0], torch.zeros_like(x[:, 0])], dim=1)


class NeverCalled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("validation must fail before any forward pass")


def _xy(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor(values, dtype=torch.float32)[:, None]
    return x, torch.zeros(len(values), dtype=torch.int64)


def _random_set(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Random inputs with random labels: the only way to fit them is to memorize.
    return (torch.from_numpy(rng.normal(size=(n, DIM)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, K, size=n)))


def _memorize(x: torch.Tensor, y: torch.Tensor, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, K))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    # Plain full-batch gradient descent: torch.optim's first step costs seconds of imports.
    for _ in range(300):
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
    return model


@pytest.fixture(scope="module")
def sets() -> dict:
    rng = np.random.default_rng(SEED)
    target_in, shadow_in = _random_set(rng, N_MEMBERS), _random_set(rng, N_MEMBERS)
    out = {name: _random_set(rng, N_FRESH) for name in ("target_out", "shadow_out", "fresh_a", "fresh_b")}
    target, shadow = _memorize(*target_in, seed=1), _memorize(*shadow_in, seed=2)
    assert (target(target_in[0]).argmax(1) == target_in[1]).float().mean() == 1.0  # it memorized
    return {"target": target, "target_in": target_in, "shadow": ShadowSets(shadow, shadow_in, out["shadow_out"]), **out}


def test_hand_computed_scores() -> None:
    # Member scores (3, 1), non-member scores (2, 0): 3 of the 4 pairs are ranked right.
    r = evaluate_scores("hand", np.array([3.0, 1.0]), np.array([2.0, 0.0]))
    assert r.auc == 0.75
    # tau = 3 (TPR 1/2, FPR 0) and tau = 1 (TPR 1, FPR 1/2) tie at 0.75; the larger is kept.
    assert (r.threshold, r.balanced_accuracy, r.advantage, r.threshold_source) == (3.0, 0.75, 0.5, "evaluated")
    # Two non-members cannot resolve an FPR of 1 % or 0.1 %.
    assert r.tpr_at_fpr == {0.001: None, 0.01: None}
    assert (r.n_members, r.n_nonmembers) == (2, 2)
    held_out = (np.array([5.0]), np.array([4.0]))
    cal = evaluate_scores("hand", np.array([3.0, 1.0]), np.array([2.0, 0.0]), held_out, "shadow")
    assert (cal.threshold, cal.balanced_accuracy, cal.threshold_source) == (5.0, 0.5, "shadow")


@pytest.mark.parametrize("name", shadow_free_attacks())
def test_shadow_free_attack_hand_case_through_a_model(name: str) -> None:
    # All four scores are increasing in x0 > 0 for label 0, so each ranks as in the hand case.
    r = run_membership_attack(name, FirstInputLogit(), _xy([3.0, 1.0]), _xy([2.0, 0.5]))
    assert r.auc == 0.75 and r.attack == name and r.balanced_accuracy == 0.75


def test_modified_entropy_hand_values() -> None:
    p = np.array([[0.8, 0.2], [0.8, 0.2]])
    # Song & Mittal 2021, Eq. 5: y=0: -0.2 log 0.8 - 0.2 log 0.8; y=1: -0.8 log 0.2 - 0.8 log 0.2.
    np.testing.assert_allclose(modified_entropy(p, np.array([0, 1])), [-0.4 * np.log(0.8), -1.6 * np.log(0.2)],
                               rtol=1e-9)
    e = prediction_entropy(p)
    assert e[0] == e[1]  # plain entropy cannot tell a confident right from a confident wrong prediction


@pytest.mark.filterwarnings("ignore:Got `batch_size` less than 1 or larger than sample size")
@pytest.mark.parametrize("name", sorted(MEMBERSHIP_ATTACKS))
def test_memorizing_model_leaks_and_independent_sets_do_not(sets: dict, name: str) -> None:
    s = sets
    leak = run_membership_attack(name, s["target"], s["target_in"], s["target_out"], shadow=s["shadow"], seed=SEED)
    # Scores that use the label see a memorized member's tiny loss; label-free ones are weaker
    # (a non-member can get a confident wrong prediction).
    uses_label = name in ("loss", "modified-entropy") or name.startswith("shadow-loss-")
    assert leak.auc > (0.9 if uses_label else 0.8) and leak.advantage > 0.5, leak
    assert leak.threshold_source == "shadow" and (leak.n_members, leak.n_nonmembers) == (N_MEMBERS, N_FRESH)
    assert leak.tpr_at_fpr[0.001] is None and 0.0 <= leak.tpr_at_fpr[0.01] <= 1.0  # 200 non-members resolve 1 %
    # Two sets the target never saw are exchangeable: AUC near 0.5 (SE about 0.03 at 200 vs 200).
    null = run_membership_attack(name, s["target"], s["fresh_a"], s["fresh_b"], shadow=s["shadow"], seed=SEED)
    assert abs(null.auc - 0.5) < 0.1, null


def test_loss_attack_without_shadow_and_calibration(sets: dict) -> None:
    s = sets
    plain = run_membership_attack("loss", s["target"], s["target_in"], s["target_out"])
    assert plain.threshold_source == "evaluated" and plain.auc > 0.9
    # The threshold chosen on the evaluated sets is the best balanced accuracy over all thresholds.
    assert plain.balanced_accuracy == pytest.approx(0.5 * (1 + plain.advantage))
    cal = run_membership_attack("loss", s["target"], s["target_in"], s["target_out"],
                                calibration=(s["target_in"], s["target_out"]))
    assert cal.threshold_source == "calibration" and cal.threshold == plain.threshold and cal.auc == plain.auc
    # Same attack, same seeds, same numbers.
    again = run_membership_attack("loss", s["target"], s["target_in"], s["target_out"])
    assert again == plain


def test_run_loss_threshold_needs_no_shadow_sets(sets: dict) -> None:
    s = sets
    outs = {k: LabeledOutputs.from_model(s["target"], *s[k]) for k in ("target_in", "target_out")}
    sh = s["shadow"]
    shadow_in, shadow_out = (LabeledOutputs.from_model(sh.model, *xy) for xy in (sh.members, sh.nonmembers))
    with_shadow = run_loss_threshold(ShadowAttackData(shadow_in, shadow_out, outs["target_in"], outs["target_out"]), 3)
    alone = run_loss_threshold(MembershipOutputs(outs["target_in"], outs["target_out"]), 3)
    # The AUC ignores the shadow sets: same seed, same balanced target subsets, same numbers.
    for key in ("auc", "tpr_at_fpr_0.001", "tpr_at_fpr_0.01", "n_target_members", "n_target_nonmembers"):
        assert alone[key] == with_shadow[key], key
    assert alone["threshold_source"] == "target" and "threshold_source" not in with_shadow
    assert alone["auc"] > 0.9 and alone["accuracy"] >= with_shadow["accuracy"]  # chosen on the evaluated sets
    with pytest.raises(ValueError, match="n_shadow must be None"):
        run_loss_threshold(MembershipOutputs(outs["target_in"], outs["target_out"]), 3, n_shadow=5)


GOOD = _xy([1.0, 2.0])
EMPTY = (torch.zeros(0, 1), torch.zeros(0, dtype=torch.int64))


@pytest.mark.parametrize(
    ("members", "nonmembers", "match"),
    [
        (EMPTY, GOOD, "members must contain at least one"),
        (GOOD, EMPTY, "nonmembers must contain at least one"),
        ((torch.zeros(3, 1), torch.zeros(2, dtype=torch.int64)), GOOD, "same length, got 3 and 2"),
        ((torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)), GOOD, "floating tensor"),
        (GOOD, (torch.zeros(2, 1), torch.zeros(2)), "integer tensor of class labels"),
        (GOOD, (torch.zeros(2, 1), torch.zeros(2, dtype=torch.bool)), "integer tensor of class labels"),
        (GOOD, (torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64)), "share an input shape"),
        (GOOD, (torch.zeros(2, 1), -torch.ones(2, dtype=torch.int64)), ">= 0"),
        ([torch.zeros(2, 1), torch.zeros(2, dtype=torch.int64)], GOOD, "tuple"),
        (np.zeros((2, 1)), GOOD, "tuple"),
    ],
)
def test_bad_input_raises_before_any_forward_pass(members, nonmembers, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run_membership_attack("loss", NeverCalled(), members, nonmembers)


def test_bad_arguments_raise_before_any_forward_pass() -> None:
    with pytest.raises(ValueError, match="must be a torch.nn.Module"):
        run_membership_attack("loss", lambda x: x, GOOD, GOOD)
    with pytest.raises(ValueError, match=r"needs shadow sets; shadow-free attacks: \['confidence'"):
        run_membership_attack("shadow-loss-logreg", NeverCalled(), GOOD, GOOD, seed=0)
    shadow = ShadowSets(NeverCalled(), GOOD, GOOD)
    with pytest.raises(ValueError, match="needs an integer seed"):
        run_membership_attack("shadow-loss-logreg", NeverCalled(), GOOD, GOOD, shadow=shadow)
    with pytest.raises(ValueError, match="seed must be an integer"):
        run_membership_attack("loss", NeverCalled(), GOOD, GOOD, seed=np.random.default_rng(0))
    with pytest.raises(ValueError, match="shadow nonmembers must contain at least one"):
        run_membership_attack("loss", NeverCalled(), GOOD, GOOD,
                              shadow=ShadowSets(NeverCalled(), GOOD, EMPTY))
    with pytest.raises(ValueError, match="calibration must be a tuple"):
        run_membership_attack("loss", NeverCalled(), GOOD, GOOD, calibration=GOOD[0])


def test_registry_refuses_duplicates_and_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"must be one of \['confidence', 'entropy', 'loss'"):
        get_membership_attack("margin")
    with pytest.raises(ValueError, match=r"must be one of .*got 'margin'"):
        run_membership_attack("margin", NeverCalled(), GOOD, GOOD)
    with pytest.raises(ValueError, match="'loss' is already registered"):
        register_membership_attack(MEMBERSHIP_ATTACKS["loss"])
    # A new attack is usable by name the moment it registers (on a copy of the registry).
    monkeypatch.setattr(runners, "MEMBERSHIP_ATTACKS", dict(MEMBERSHIP_ATTACKS))
    neg = MembershipAttack("neg-first-input", lambda shadow, seed: lambda o: -o.probs[:, 0], False, "test")
    register_membership_attack(neg)
    assert run_membership_attack("neg-first-input", FirstInputLogit(), _xy([3.0, 1.0]), _xy([2.0, 0.5])).auc == 0.25
    with pytest.raises(ValueError, match="already registered"):
        register_membership_attack(neg)
