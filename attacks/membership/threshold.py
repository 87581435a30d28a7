"""Loss-threshold membership baseline (Yeom et al. 2018).

Members tend to have lower loss, so the score is ``-loss``. The threshold-free
AUC and TPR at low FPR are computed on the target data; optionally a single
threshold is chosen on the shadow data (maximizing balanced accuracy there) and
its accuracy on the target data is reported.
"""

from __future__ import annotations

import numpy as np

from attacks.membership.features import cross_entropy_loss
from attacks.membership.roc import roc_summary
from attacks.membership.shadow import ShadowAttackData, balance


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


def run_loss_threshold(
    data: ShadowAttackData, seed: int, n_shadow: int | None = None, n_target: int | None = None
) -> dict[str, float | int | str]:
    """Loss-threshold attack on the same balanced subsets as :func:`run_shadow_mia`.

    Returns
    -------
    dict
        ``feature="loss"``, ``classifier="threshold"``, ``auc``,
        ``tpr_at_fpr_0.001``, ``tpr_at_fpr_0.01`` (threshold-free, on the target
        data, score ``-loss``), ``threshold`` (chosen on shadow data),
        ``accuracy`` (balanced target accuracy at that threshold), ``seed`` and
        the four ``n_*`` counts.
    """
    data = balance(data, seed, n_shadow, n_target)
    loss = {
        name: cross_entropy_loss(part.probs, part.labels)
        for name, part in (
            ("sm", data.shadow_members),
            ("so", data.shadow_nonmembers),
            ("tm", data.target_members),
            ("to", data.target_nonmembers),
        )
    }
    is_member = np.concatenate([np.ones(loss["tm"].size, np.int64), np.zeros(loss["to"].size, np.int64)])
    scores = -np.concatenate([loss["tm"], loss["to"]])
    tau, _ = best_loss_threshold(loss["sm"], loss["so"])
    accuracy = 0.5 * (np.mean(loss["tm"] <= tau) + np.mean(loss["to"] > tau))
    return {
        "feature": "loss",
        "classifier": "threshold",
        **roc_summary(is_member, scores),
        "threshold": tau,
        "accuracy": float(accuracy),
        "seed": seed,
        **data.counts(),
    }
