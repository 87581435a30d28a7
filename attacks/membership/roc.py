"""ROC summaries of a membership attack: AUC and TPR at a fixed low FPR.

Members are the positive class (label 1), non-members the negative class (0);
a higher score means "more likely a member".
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

#: FPR operating points reported by every membership attack (0.1 % and 1 %).
FPR_TARGETS: tuple[float, ...] = (0.001, 0.01)


def _check(is_member: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(is_member)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim != 1 or s.shape != y.shape:
        raise ValueError(f"is_member and scores must be 1-D of equal length, got {y.shape} and {s.shape}")
    if not np.all(np.isin(y, (0, 1))):
        raise ValueError("is_member must contain only 0 (non-member) and 1 (member)")
    if y.min(initial=1) == 1 or y.max(initial=0) == 0:
        raise ValueError("is_member must contain both members (1) and non-members (0)")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    return y.astype(np.int64), s


def attack_auc(is_member: np.ndarray, scores: np.ndarray) -> float:
    """Threshold-free ROC-AUC (``sklearn.metrics.roc_auc_score``); 0.5 is chance."""
    y, s = _check(is_member, scores)
    return float(roc_auc_score(y, s))


def tpr_at_fpr(is_member: np.ndarray, scores: np.ndarray, fpr: float) -> float:
    """True-positive rate at false-positive rate ``fpr``, interpolated conservatively.

    From ``sklearn.metrics.roc_curve`` (all thresholds kept) this returns the
    largest TPR among operating points whose FPR is **at most** ``fpr`` (step
    interpolation, as in Carlini et al. 2022, "MIA from first principles").
    Linear interpolation between ROC points would credit the attacker with a
    randomized classifier and overstate low-FPR power; this never does.

    With ``n`` non-members the achievable FPRs are multiples of ``1 / n``; when
    ``1 / n > fpr`` the value is the TPR at zero false positives (report the
    counts alongside, as :func:`attacks.membership.shadow.run_shadow_mia` does).
    """
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr}")
    y, s = _check(is_member, scores)
    fprs, tprs, _ = roc_curve(y, s, drop_intermediate=False)
    # roc_curve always starts at (0, 0), so the mask is never empty.
    return float(tprs[fprs <= fpr + 1e-12].max())


def roc_summary(is_member: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """``auc`` and ``tpr_at_fpr_<f>`` for every ``f`` in :data:`FPR_TARGETS`."""
    out = {"auc": attack_auc(is_member, scores)}
    for f in FPR_TARGETS:
        out[f"tpr_at_fpr_{f:g}"] = tpr_at_fpr(is_member, scores, f)
    return out
