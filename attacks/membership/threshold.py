"""Loss-threshold membership baseline (Yeom et al. 2018) and threshold rules on attack scores.

Members tend to have lower loss, so the score is ``-loss``. The threshold-free
AUC and TPR at low FPR are computed on the target data. A single threshold is
chosen on the shadow data when there is some (maximizing balanced accuracy
there) and its accuracy on the target data is reported; without shadow data it
is chosen on the target data itself, which upper-bounds what an attacker who
must pick it blindly achieves (``threshold_source="target"``).
"""

from __future__ import annotations

import numpy as np

from attacks.membership.features import cross_entropy_loss
from attacks.membership.roc import roc_summary
from attacks.membership.shadow import LabeledOutputs, MembershipOutputs, ShadowAttackData, balance, balance_members


def best_loss_threshold(member_losses: np.ndarray, nonmember_losses: np.ndarray) -> tuple[float, float]:
    """Threshold ``tau`` maximizing accuracy of "member iff loss <= tau", and that accuracy.

    Accuracy is balanced (mean of TPR and TNR), so unequal set sizes do not
    shift the threshold. Candidates are the observed losses; ties keep the
    smallest ``tau``.
    """
    m = np.asarray(member_losses, dtype=np.float64)
    o = np.asarray(nonmember_losses, dtype=np.float64)
    if m.ndim != 1 or m.size == 0:
        raise ValueError(f"member_losses must be a non-empty 1-D array, got shape {m.shape}")
    if o.ndim != 1 or o.size == 0:
        raise ValueError(f"nonmember_losses must be a non-empty 1-D array, got shape {o.shape}")
    cand = np.unique(np.concatenate([m, o]))
    tpr = np.searchsorted(np.sort(m), cand, side="right") / m.size
    fpr = np.searchsorted(np.sort(o), cand, side="right") / o.size
    acc = 0.5 * (tpr + 1.0 - fpr)
    i = int(np.argmax(acc))
    return float(cand[i]), float(acc[i])


def best_score_threshold(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> tuple[float, float]:
    """Threshold ``tau`` maximizing balanced accuracy of "member iff score >= tau", and that accuracy.

    :func:`best_loss_threshold` on the negated scores (negation is exact, so a loss
    attack with ``score = -loss`` gets exactly ``-tau_loss``); ties keep the largest
    ``tau``, the fewest member claims.
    """
    tau, acc = best_loss_threshold(-np.asarray(member_scores, np.float64), -np.asarray(nonmember_scores, np.float64))
    return -tau, acc


def rates_at_threshold(member_scores: np.ndarray, nonmember_scores: np.ndarray, tau: float) -> tuple[float, float]:
    """``(TPR, FPR)`` of the rule "member iff score >= tau"."""
    return float(np.mean(np.asarray(member_scores) >= tau)), float(np.mean(np.asarray(nonmember_scores) >= tau))


def _losses(part: LabeledOutputs) -> np.ndarray:
    return cross_entropy_loss(part.probs, part.labels)


def run_loss_threshold(
    data: ShadowAttackData | MembershipOutputs, seed: int, n_shadow: int | None = None, n_target: int | None = None
) -> dict[str, float | int | str]:
    """Loss-threshold attack on the same balanced subsets as :func:`run_shadow_mia`.

    Parameters
    ----------
    data : ShadowAttackData or MembershipOutputs
        With shadow sets, the threshold is chosen on them; with only the target
        pair (:class:`MembershipOutputs`), it is chosen on the target sets (an upper
        bound on the attacker) and ``n_shadow`` must be None. The AUC and TPRs do not
        depend on the shadow sets: for equal ``seed`` and ``n_target`` both forms
        subsample the same target examples and report the same values.
    seed : int
        Seed of the balanced subsampling (:func:`balance`, :func:`balance_members`).
    n_shadow, n_target : int or None
        Examples per class; ``None`` uses all of the smaller set of each pair.

    Returns
    -------
    dict
        ``feature="loss"``, ``classifier="threshold"``, ``auc``,
        ``tpr_at_fpr_0.001``, ``tpr_at_fpr_0.01`` (threshold-free, on the target
        data, score ``-loss``), ``threshold`` (on the loss), ``accuracy`` (balanced
        target accuracy at that threshold), ``seed`` and the ``n_*`` counts; without
        shadow sets also ``threshold_source="target"``.
    """
    if isinstance(data, MembershipOutputs):
        if n_shadow is not None:
            raise ValueError(f"n_shadow must be None without shadow sets, got {n_shadow}")
        target = balance_members(data, seed, n_target)
        calibration, source, counts = target, {"threshold_source": "target"}, target.counts("target_")
    elif isinstance(data, ShadowAttackData):
        data = balance(data, seed, n_shadow, n_target)
        target = MembershipOutputs(data.target_members, data.target_nonmembers)
        calibration, source, counts = MembershipOutputs(data.shadow_members, data.shadow_nonmembers), {}, data.counts()
    else:
        raise ValueError(f"data must be ShadowAttackData or MembershipOutputs, got {type(data).__name__}")
    loss_tm, loss_to = _losses(target.members), _losses(target.nonmembers)
    is_member = np.concatenate([np.ones(loss_tm.size, np.int64), np.zeros(loss_to.size, np.int64)])
    scores = -np.concatenate([loss_tm, loss_to])
    tau, _ = best_loss_threshold(_losses(calibration.members), _losses(calibration.nonmembers))
    accuracy = 0.5 * (np.mean(loss_tm <= tau) + np.mean(loss_to > tau))
    return {
        "feature": "loss",
        "classifier": "threshold",
        **roc_summary(is_member, scores),
        "threshold": tau,
        "accuracy": float(accuracy),
        **source,
        "seed": seed,
        **counts,
    }
