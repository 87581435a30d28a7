"""Shadow-model membership inference (Shokri et al. 2017) on scalar output features.

Following the seed paper on DP in decentralized FL: each of three scalar features
(confidence, loss, entropy; :mod:`attacks.membership.features`) is used on its
own, standardized with shadow-data statistics, and fed to two scikit-learn
classifiers trained on shadow-train members vs shadow-holdout non-members. The
attack is evaluated on target-train members vs target-holdout non-members. The
adversary sees only softmax probabilities (and labels, for the loss feature),
obtained with :func:`model_outputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from sklearn.base import ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from torch import Tensor, nn

from attacks.membership.features import FEATURES, fit_standardizer, standardize, validate_labels, validate_probs
from attacks.membership.roc import roc_summary
from registry import streams


@torch.no_grad()
def model_outputs(model: nn.Module, x: Tensor, batch_size: int = 512) -> np.ndarray:
    """Softmax probabilities of ``model`` on ``x``, in eval mode and without gradients.

    Parameters
    ----------
    model : torch.nn.Module
        Classifier returning logits of shape ``(batch, K)``. It is switched to
        eval mode (dropout off, batch-norm running statistics) for the call and
        its previous mode is restored afterwards.
    x : torch.Tensor
        Inputs of shape ``(n, *input_shape)``; moved batch by batch to the
        device of the model's first parameter (CPU for a parameterless model).
    batch_size : int, default 512
        Batch size of the forward passes; the result does not depend on it
        beyond floating-point summation order.

    Returns
    -------
    numpy.ndarray
        Float64 array of shape ``(n, K)`` whose rows sum to 1.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(x, Tensor) or x.ndim < 2:
        raise ValueError(f"x must be a tensor of shape (n, *input_shape), got {getattr(x, 'shape', type(x))}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    try:
        chunks = []
        for start in range(0, x.shape[0], batch_size):
            logits = model(x[start : start + batch_size].to(device))
            if logits.ndim != 2:
                raise ValueError(f"model must return logits of shape (batch, K), got {tuple(logits.shape)}")
            # Softmax in float64 so that tiny probabilities (the loss feature) keep their precision.
            chunks.append(torch.softmax(logits.double(), dim=1).cpu().numpy())
    finally:
        model.train(was_training)
    if not chunks:
        raise ValueError("x must contain at least one example, got 0")
    return np.concatenate(chunks, axis=0)


@dataclass(frozen=True)
class LabeledOutputs:
    """Softmax probabilities ``(n, K)`` of one model on one set, with true labels ``(n,)``."""

    probs: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        p = validate_probs(self.probs)
        object.__setattr__(self, "probs", p)
        object.__setattr__(self, "labels", validate_labels(self.labels, p.shape[0], p.shape[1]))

    @classmethod
    def from_model(cls, model: nn.Module, x: Tensor, labels: Tensor | np.ndarray, batch_size: int = 512) -> LabeledOutputs:
        """Outputs of ``model`` on ``x`` (:func:`model_outputs`) with the true ``labels``."""
        y = labels.detach().cpu().numpy() if isinstance(labels, Tensor) else np.asarray(labels)
        return cls(model_outputs(model, x, batch_size), y)

    def __len__(self) -> int:
        return int(self.probs.shape[0])

    def subset(self, index: np.ndarray) -> LabeledOutputs:
        """The rows ``index`` of this set."""
        return LabeledOutputs(self.probs[index], self.labels[index])


@dataclass(frozen=True)
class MembershipOutputs:
    """Outputs of one model on its members and on non-members: what a shadow-free attack needs."""

    members: LabeledOutputs
    nonmembers: LabeledOutputs

    def __post_init__(self) -> None:
        for f in fields(self):
            part = getattr(self, f.name)
            if not isinstance(part, LabeledOutputs):
                raise ValueError(f"{f.name} must be LabeledOutputs, got {type(part).__name__}")
            if len(part) == 0:
                raise ValueError(f"{f.name} must contain at least one example, got 0")
        k_m, k_o = self.members.probs.shape[1], self.nonmembers.probs.shape[1]
        if k_m != k_o:
            raise ValueError(f"members and nonmembers must have the same number of classes, got {k_m} and {k_o}")

    def counts(self, prefix: str = "") -> dict[str, int]:
        """``n_<prefix>members`` and ``n_<prefix>nonmembers``."""
        return {f"n_{prefix}members": len(self.members), f"n_{prefix}nonmembers": len(self.nonmembers)}


@dataclass(frozen=True)
class ShadowAttackData:
    """The four sets of the shadow-model attack.

    ``shadow_*`` are outputs of the shadow model on its own training data
    (members) and on held-out data (non-members); ``target_*`` are outputs of the
    attacked (final) model on its training data and on held-out data.
    """

    shadow_members: LabeledOutputs
    shadow_nonmembers: LabeledOutputs
    target_members: LabeledOutputs
    target_nonmembers: LabeledOutputs

    def __post_init__(self) -> None:
        ks = set()
        for f in fields(self):
            part = getattr(self, f.name)
            if not isinstance(part, LabeledOutputs):
                raise ValueError(f"{f.name} must be LabeledOutputs, got {type(part).__name__}")
            if len(part) == 0:
                raise ValueError(f"{f.name} must contain at least one example, got 0")
            ks.add(part.probs.shape[1])
        if len(ks) != 1:
            raise ValueError(f"all four sets must have the same number of classes, got {sorted(ks)}")

    def counts(self) -> dict[str, int]:
        """``n_<set>`` for each of the four sets."""
        return {f"n_{f.name}": len(getattr(self, f.name)) for f in fields(self)}


def _make_logreg(seed: int) -> ClassifierMixin:
    return LogisticRegression(max_iter=2000, random_state=seed)


def _make_mlp(seed: int) -> ClassifierMixin:
    return MLPClassifier(
        hidden_layer_sizes=(64, 32),
        activation="relu",
        solver="adam",
        batch_size=256,
        learning_rate_init=1e-3,
        max_iter=300,
        early_stopping=True,
        validation_fraction=0.2,
        random_state=seed,
    )


#: Attack classifiers: name -> factory(seed) (settings of the seed paper).
CLASSIFIERS: dict[str, Callable[[int], ClassifierMixin]] = {"logreg": _make_logreg, "mlp": _make_mlp}


def _take(part: LabeledOutputs, n: int, rng: np.random.Generator) -> LabeledOutputs:
    return part.subset(np.sort(rng.choice(len(part), size=n, replace=False)))


def balance(
    data: ShadowAttackData, seed: int, n_shadow: int | None = None, n_target: int | None = None
) -> ShadowAttackData:
    """Subsample to equal member and non-member counts with a seeded generator.

    Parameters
    ----------
    data : ShadowAttackData
        The four sets, of any sizes.
    seed : int
        Seed of the subsampling (``numpy.random.default_rng``); the same seed
        gives the same subsets, so the shadow attack and the threshold baseline
        see identical examples.
    n_shadow, n_target : int or None
        Examples per class (members and non-members each) for the shadow and
        target pairs; ``None`` means as many as the smaller set of the pair.
        The paper uses 5,000 each.

    Raises
    ------
    ValueError
        If a requested count is < 1 or exceeds the smaller set of its pair.
    """
    gens = _balance_generators(seed)
    pairs = (
        ("n_shadow", n_shadow, data.shadow_members, data.shadow_nonmembers),
        ("n_target", n_target, data.target_members, data.target_nonmembers),
    )
    parts: list[LabeledOutputs] = []
    for i, (name, n, members, nonmembers) in enumerate(pairs):
        parts += _balance_pair(name, n, members, nonmembers, gens[2 * i], gens[2 * i + 1])
    return ShadowAttackData(*parts)


def balance_members(data: MembershipOutputs, seed: int, n_target: int | None = None) -> MembershipOutputs:
    """:func:`balance` for a target pair alone (no shadow sets).

    Draws from the same generator streams :func:`balance` uses for the target pair, so
    with equal ``seed`` and ``n_target`` both select exactly the same target examples.
    """
    gens = _balance_generators(seed)
    return MembershipOutputs(*_balance_pair("n_target", n_target, data.members, data.nonmembers, gens[2], gens[3]))


def _balance_generators(seed: int) -> list[np.random.Generator]:
    # Streams 0, 1: shadow members / non-members; 2, 3: target members / non-members.
    return [np.random.default_rng(s) for s in streams.spawn("attacks.shadow-balance", seed, 4)]


def _balance_pair(
    name: str, n: int | None, members: LabeledOutputs, nonmembers: LabeledOutputs,
    g_members: np.random.Generator, g_nonmembers: np.random.Generator,
) -> list[LabeledOutputs]:
    available = min(len(members), len(nonmembers))
    if n is None:
        n = available
    if not 1 <= n <= available:
        raise ValueError(f"{name} must be in [1, {available}] (smaller set of the pair), got {n}")
    return [_take(members, n, g_members), _take(nonmembers, n, g_nonmembers)]


def _feature_and_target(
    feature: str, members: LabeledOutputs, nonmembers: LabeledOutputs
) -> tuple[np.ndarray, np.ndarray]:
    fn = FEATURES[feature]
    x = np.concatenate([fn(members.probs, members.labels), fn(nonmembers.probs, nonmembers.labels)])
    y = np.concatenate([np.ones(len(members), np.int64), np.zeros(len(nonmembers), np.int64)])
    return x, y


def fit_shadow_scorer(
    feature: str, classifier: str, shadow: MembershipOutputs, seed: int
) -> Callable[[LabeledOutputs], np.ndarray]:
    """Fit one (feature, classifier) attack model on shadow data; return its member-probability scorer.

    The feature is standardized with shadow-data statistics only (the adversary cannot
    label target data) and the classifier (:data:`CLASSIFIERS`, ``random_state=seed``)
    learns shadow members (1) vs shadow non-members (0). The returned function maps
    outputs of any model to ``P(member)``, shape ``(n,)``.
    """
    if feature not in FEATURES:
        raise ValueError(f"feature must be one of {sorted(FEATURES)}, got {feature!r}")
    if classifier not in CLASSIFIERS:
        raise ValueError(f"classifier must be one of {sorted(CLASSIFIERS)}, got {classifier!r}")
    x_shadow, y_shadow = _feature_and_target(feature, shadow.members, shadow.nonmembers)
    mean, sd = fit_standardizer(x_shadow, name=f"{feature} on shadow data")
    clf = CLASSIFIERS[classifier](seed)
    clf.fit(standardize(x_shadow, mean, sd)[:, None], y_shadow)
    member_col = list(clf.classes_).index(1)
    fn = FEATURES[feature]

    def score(part: LabeledOutputs) -> np.ndarray:
        z = standardize(fn(part.probs, part.labels), mean, sd)[:, None]
        return clf.predict_proba(z)[:, member_col]

    return score


def run_shadow_mia(
    data: ShadowAttackData,
    seed: int,
    n_shadow: int | None = None,
    n_target: int | None = None,
    features: Sequence[str] = tuple(FEATURES),
    classifiers: Sequence[str] = tuple(CLASSIFIERS),
) -> list[dict[str, float | int | str]]:
    """Shadow-model attack: one row per (feature, classifier).

    Parameters
    ----------
    data : ShadowAttackData
        Outputs of the shadow and target models (see the class docstring).
    seed : int
        Seeds the balanced subsampling (:func:`balance`) and the classifiers.
    n_shadow, n_target : int or None
        Examples per class; ``None`` uses all of the smaller set of each pair.
    features : sequence of str
        Names from :data:`attacks.membership.features.FEATURES`.
    classifiers : sequence of str
        Names from :data:`CLASSIFIERS`.

    Returns
    -------
    list of dict
        Keys ``feature``, ``classifier``, ``auc``, ``tpr_at_fpr_0.001``,
        ``tpr_at_fpr_0.01``, ``accuracy`` (target, at the classifier's own 0.5
        decision rule), ``seed`` and the four ``n_*`` counts actually used.
    """
    for name in features:
        if name not in FEATURES:
            raise ValueError(f"features must be names from {sorted(FEATURES)}, got {name!r}")
    for name in classifiers:
        if name not in CLASSIFIERS:
            raise ValueError(f"classifiers must be names from {sorted(CLASSIFIERS)}, got {name!r}")
    data = balance(data, seed, n_shadow, n_target)
    rows: list[dict[str, float | int | str]] = []
    for feature in features:
        x_shadow, y_shadow = _feature_and_target(feature, data.shadow_members, data.shadow_nonmembers)
        x_target, y_target = _feature_and_target(feature, data.target_members, data.target_nonmembers)
        # Statistics from the shadow data only: the adversary cannot label target data.
        mean, sd = fit_standardizer(x_shadow, name=f"{feature} on shadow data")
        z_shadow = standardize(x_shadow, mean, sd)[:, None]
        z_target = standardize(x_target, mean, sd)[:, None]
        for clf_name in classifiers:
            clf = CLASSIFIERS[clf_name](seed)
            clf.fit(z_shadow, y_shadow)
            member_col = list(clf.classes_).index(1)
            scores = clf.predict_proba(z_target)[:, member_col]
            rows.append(
                {
                    "feature": feature,
                    "classifier": clf_name,
                    **roc_summary(y_target, scores),
                    "accuracy": float(np.mean(clf.predict(z_target) == y_target)),
                    "seed": seed,
                    **data.counts(),
                }
            )
    return rows
