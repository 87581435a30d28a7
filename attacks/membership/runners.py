"""Membership attack runners: a model, its members and non-members in, one result out.

A study picks an attack by name from :data:`MEMBERSHIP_ATTACKS` (timm-style registry)
and calls :func:`run_membership_attack`. The adversary sees only the model's softmax
outputs (and the candidates' labels). Shadow-free attacks score each candidate directly:

- ``loss``: ``-loss`` (Yeom et al. 2018, the loss-threshold attack);
- ``confidence``: top-class confidence (Salem et al. 2019, ML-Leaks, adversary 3);
- ``entropy``: ``-entropy`` of the prediction (Salem et al. 2019);
- ``modified-entropy``: ``-Mentr`` (Song & Mittal 2021, Eq. 5), which uses the label.

Shadow attacks ``shadow-<feature>-<classifier>`` (Shokri et al. 2017, as in
:func:`attacks.membership.shadow.run_shadow_mia`) take the same interface plus
:class:`ShadowSets` (a shadow model with its own members and non-members).

Threshold choice. The AUC and TPR at low FPR are threshold-free. The balanced accuracy and
advantage (TPR - FPR, Yeom et al. 2018, Def. 4) hold at one threshold on the score,
"member iff score >= threshold", chosen to maximize balanced accuracy on, first found of:
``calibration`` (held-out candidates of the *target* model whose membership the attacker
knows), the shadow sets, or else the evaluated sets themselves. The last
(``threshold_source="evaluated"``) is an upper bound on a real attacker, who cannot label
the evaluated candidates. No set is subsampled: every metric here is insensitive to the
member / non-member ratio (balance beforehand with :func:`~attacks.membership.shadow.balance`
to reproduce the paper protocol).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from attacks.membership.features import FEATURES, confidence, cross_entropy_loss, modified_entropy, prediction_entropy
from attacks.membership.roc import FPR_TARGETS, attack_auc, tpr_at_fpr
from attacks.membership.shadow import CLASSIFIERS, LabeledOutputs, MembershipOutputs, balance_members, fit_shadow_scorer
from attacks.membership.threshold import best_score_threshold, rates_at_threshold

#: ``(x, y)``: inputs ``(n, *input_shape)`` (floating) and integer class labels ``(n,)``.
XY = tuple[Tensor, Tensor]
#: Maps one model's outputs on a set to one membership score per example (higher: member).
Scorer = Callable[[LabeledOutputs], np.ndarray]


@dataclass(frozen=True)
class ShadowSets:
    """A shadow model with its own members (training data) and non-members (held out).

    ``shadow-*`` attacks train their classifier on equal numbers of both, subsampling the
    larger set with the attack's seed (:func:`~attacks.membership.shadow.balance_members`).
    """

    model: nn.Module
    members: XY
    nonmembers: XY


@dataclass(frozen=True)
class MembershipAttackResult:
    """Metrics of one membership attack on one member / non-member pair.

    ``tpr_at_fpr`` maps each FPR in :data:`~attacks.membership.roc.FPR_TARGETS` to the TPR
    (:func:`~attacks.membership.roc.tpr_at_fpr`), or ``None`` where ``n_nonmembers`` is too
    small to resolve that FPR (``n_nonmembers * fpr < 1``). ``threshold`` is on the
    attack's score, ``threshold_source`` one of ``"evaluated"``, ``"shadow"``,
    ``"calibration"`` (see the module docstring).
    """

    attack: str
    auc: float
    tpr_at_fpr: dict[float, float | None]
    threshold: float
    threshold_source: str
    balanced_accuracy: float
    advantage: float
    n_members: int
    n_nonmembers: int

    def as_row(self) -> dict[str, float | int | str | None]:
        """Flat dict (``tpr_at_fpr_<f>`` keys as in :func:`~attacks.membership.roc.roc_summary`)."""
        return {
            "attack": self.attack,
            "auc": self.auc,
            **{f"tpr_at_fpr_{f:g}": t for f, t in self.tpr_at_fpr.items()},
            "threshold": self.threshold,
            "threshold_source": self.threshold_source,
            "balanced_accuracy": self.balanced_accuracy,
            "advantage": self.advantage,
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
        }


@dataclass(frozen=True)
class MembershipAttack:
    """A registered attack: ``make_scorer(shadow_outputs, seed) -> Scorer``.

    Shadow-free attacks ignore both arguments; attacks with ``needs_shadow`` get the shadow
    model's outputs on its members and non-members, and the ``seed`` of their classifier.
    """

    name: str
    make_scorer: Callable[[MembershipOutputs | None, int | None], Scorer]
    needs_shadow: bool
    reference: str


#: Registry: attack name -> :class:`MembershipAttack`. Add with :func:`register_membership_attack`.
MEMBERSHIP_ATTACKS: dict[str, MembershipAttack] = {}


def register_membership_attack(attack: MembershipAttack) -> MembershipAttack:
    """Add ``attack`` to :data:`MEMBERSHIP_ATTACKS`; a name already taken raises ValueError."""
    if not isinstance(attack, MembershipAttack):
        raise ValueError(f"attack must be a MembershipAttack, got {type(attack).__name__}")
    if attack.name in MEMBERSHIP_ATTACKS:
        raise ValueError(f"membership attack {attack.name!r} is already registered")
    MEMBERSHIP_ATTACKS[attack.name] = attack
    return attack


def get_membership_attack(name: str) -> MembershipAttack:
    """The registered attack ``name``; an unknown name raises ValueError listing the allowed ones."""
    if name not in MEMBERSHIP_ATTACKS:
        raise ValueError(f"membership attack must be one of {sorted(MEMBERSHIP_ATTACKS)}, got {name!r}")
    return MEMBERSHIP_ATTACKS[name]


def shadow_free_attacks() -> list[str]:
    """Names of the registered attacks that need no shadow model."""
    return sorted(n for n, a in MEMBERSHIP_ATTACKS.items() if not a.needs_shadow)


def _score_attack(name: str, score: Scorer, reference: str) -> MembershipAttack:
    return MembershipAttack(name, lambda shadow, seed: score, needs_shadow=False, reference=reference)


def _shadow_attack(feature: str, classifier: str) -> MembershipAttack:
    def make(shadow: MembershipOutputs | None, seed: int | None) -> Scorer:
        if shadow is None or seed is None:
            raise ValueError(f"shadow-{feature}-{classifier} needs shadow outputs and a seed")
        # The attack classifier learns from equal class counts (paper protocol); with unequal
        # shadow sets the MLP would learn the prior ("non-member") and rank at random.
        return fit_shadow_scorer(feature, classifier, balance_members(shadow, seed), seed)

    return MembershipAttack(f"shadow-{feature}-{classifier}", make, needs_shadow=True,
                            reference="Shokri et al. 2017; seed paper on DP in decentralized FL")


for _attack in (
    _score_attack("loss", lambda o: -cross_entropy_loss(o.probs, o.labels), "Yeom et al. 2018"),
    _score_attack("confidence", lambda o: confidence(o.probs), "Salem et al. 2019"),
    _score_attack("entropy", lambda o: -prediction_entropy(o.probs), "Salem et al. 2019"),
    _score_attack("modified-entropy", lambda o: -modified_entropy(o.probs, o.labels), "Song & Mittal 2021"),
    *(_shadow_attack(f, c) for f in FEATURES for c in CLASSIFIERS),
):
    register_membership_attack(_attack)


def _check_shadow_and_seed(attack: MembershipAttack, has_shadow: bool, seed: int | None) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    if attack.needs_shadow and not has_shadow:
        raise ValueError(f"attack {attack.name!r} needs shadow sets; shadow-free attacks: {shadow_free_attacks()}")
    if attack.needs_shadow and seed is None:
        raise ValueError(f"attack {attack.name!r} trains a classifier and needs an integer seed, got None")


def evaluate_scores(
    attack: str,
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    calibration: tuple[np.ndarray, np.ndarray] | None = None,
    threshold_source: str = "evaluated",
) -> MembershipAttackResult:
    """Metrics of scores (higher: member); the threshold is chosen on ``calibration`` when given.

    ``calibration`` is ``(member_scores, nonmember_scores)`` of held-out candidates, named
    by ``threshold_source``; without it the threshold is chosen on the evaluated scores.
    """
    m = np.asarray(member_scores, dtype=np.float64)
    o = np.asarray(nonmember_scores, dtype=np.float64)
    is_member = np.concatenate([np.ones(m.size, np.int64), np.zeros(o.size, np.int64)])
    scores = np.concatenate([m, o])
    auc = attack_auc(is_member, scores)  # validates: 1-D, both classes present, finite
    tprs = {f: tpr_at_fpr(is_member, scores, f) if o.size * f >= 1 - 1e-9 else None for f in FPR_TARGETS}
    if calibration is None:
        threshold_source = "evaluated"
        calibration = (m, o)
    tau, _ = best_score_threshold(*calibration)
    tpr, fpr = rates_at_threshold(m, o, tau)
    return MembershipAttackResult(attack, auc, tprs, tau, threshold_source, 0.5 * (tpr + 1.0 - fpr), tpr - fpr,
                                  int(m.size), int(o.size))


def run_membership_attack_on_outputs(
    name: str,
    target: MembershipOutputs,
    *,
    shadow: MembershipOutputs | None = None,
    calibration: MembershipOutputs | None = None,
    seed: int | None = None,
) -> MembershipAttackResult:
    """:func:`run_membership_attack` on precomputed softmax outputs (:class:`MembershipOutputs`)."""
    attack = get_membership_attack(name)
    for label, part in (("target", target), ("shadow", shadow), ("calibration", calibration)):
        if part is not None and not isinstance(part, MembershipOutputs):
            raise ValueError(f"{label} must be MembershipOutputs, got {type(part).__name__}")
    _check_shadow_and_seed(attack, shadow is not None, seed)
    score = attack.make_scorer(shadow, None if seed is None else int(seed))
    cal, source = None, "evaluated"
    for label, part in (("calibration", calibration), ("shadow", shadow)):
        if part is not None:
            cal, source = (score(part.members), score(part.nonmembers)), label
            break
    return evaluate_scores(name, score(target.members), score(target.nonmembers), cal, source)


def check_member_sets(members: XY, nonmembers: XY, label: str = "") -> None:
    """Raise ValueError unless both are non-empty ``(x, y)`` tensor pairs of one input shape."""
    for name, xy in ((f"{label}members", members), (f"{label}nonmembers", nonmembers)):
        if not isinstance(xy, tuple) or len(xy) != 2 or not all(isinstance(t, Tensor) for t in xy):
            raise ValueError(f"{name} must be a tuple (x, y) of two torch tensors, got {type(xy).__name__}")
        x, y = xy
        if x.ndim < 2 or not x.is_floating_point():
            raise ValueError(f"{name} x must be a floating tensor of shape (n, *input_shape), "
                             f"got dtype {x.dtype} and shape {tuple(x.shape)}")
        if y.ndim != 1 or y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
            raise ValueError(f"{name} y must be a 1-D integer tensor of class labels, "
                             f"got dtype {y.dtype} and shape {tuple(y.shape)}")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{name} x and y must have the same length, got {x.shape[0]} and {y.shape[0]}")
        if x.shape[0] == 0:
            raise ValueError(f"{name} must contain at least one example, got 0")
        if int(y.min()) < 0:
            raise ValueError(f"{name} y must be class indices >= 0, got min {int(y.min())}")
    if members[0].shape[1:] != nonmembers[0].shape[1:]:
        raise ValueError(f"{label}members and {label}nonmembers must share an input shape, "
                         f"got {tuple(members[0].shape[1:])} and {tuple(nonmembers[0].shape[1:])}")


def run_membership_attack(
    name: str,
    model: nn.Module,
    members: XY,
    nonmembers: XY,
    *,
    shadow: ShadowSets | None = None,
    calibration: tuple[XY, XY] | None = None,
    seed: int | None = None,
    batch_size: int = 512,
) -> MembershipAttackResult:
    """Run the registered membership attack ``name`` against ``model``.

    Parameters
    ----------
    name : str
        A key of :data:`MEMBERSHIP_ATTACKS`, e.g. ``"loss"`` or ``"shadow-loss-logreg"``.
    model : torch.nn.Module
        The attacked classifier (logits ``(batch, K)``); queried in eval mode, no gradients.
    members, nonmembers : (x, y)
        Candidates in / not in the model's training data: floating inputs ``(n, ...)`` and
        integer labels ``(n,)``.
    shadow : ShadowSets or None
        Required by ``shadow-*`` attacks; for shadow-free attacks it only picks the
        threshold (as :func:`~attacks.membership.threshold.run_loss_threshold` does).
    calibration : ((x, y), (x, y)) or None
        Held-out members and non-members of ``model`` known to the attacker; when given,
        the threshold is chosen on them (before ``shadow``).
    seed : int or None
        Seed of the attack classifier (``random_state``); required by ``shadow-*``
        attacks. Shadow-free attacks use no randomness.
    batch_size : int
        Forward-pass batch size.

    Returns
    -------
    MembershipAttackResult

    Raises
    ------
    ValueError
        Before any forward pass: an unknown name (listing the allowed ones), a missing
        shadow or seed, empty sets, mismatched x / y lengths or input shapes, non-floating
        inputs or non-integer labels.
    """
    attack = get_membership_attack(name)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_member_sets(members, nonmembers)
    if calibration is not None:
        if not isinstance(calibration, tuple) or len(calibration) != 2:
            raise ValueError("calibration must be a tuple (members, nonmembers) of (x, y) pairs")
        check_member_sets(*calibration, label="calibration ")
    if shadow is not None:
        if not isinstance(shadow, ShadowSets) or not isinstance(shadow.model, nn.Module):
            raise ValueError(f"shadow must be ShadowSets with a torch.nn.Module, got {type(shadow).__name__}")
        check_member_sets(shadow.members, shadow.nonmembers, label="shadow ")
    _check_shadow_and_seed(attack, shadow is not None, seed)

    def outputs(m: nn.Module, pair: tuple[XY, XY]) -> MembershipOutputs:
        return MembershipOutputs(*(LabeledOutputs.from_model(m, x, y, batch_size) for x, y in pair))

    return run_membership_attack_on_outputs(
        name,
        outputs(model, (members, nonmembers)),
        shadow=None if shadow is None else outputs(shadow.model, (shadow.members, shadow.nonmembers)),
        calibration=None if calibration is None else outputs(model, calibration),
        seed=seed,
    )
