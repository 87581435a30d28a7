"""Membership inference: shadow-model attack and loss-threshold baseline."""

from attacks.membership.features import FEATURES, confidence, cross_entropy_loss, prediction_entropy
from attacks.membership.roc import FPR_TARGETS, attack_auc, roc_summary, tpr_at_fpr
from attacks.membership.shadow import (
    CLASSIFIERS,
    LabeledOutputs,
    ShadowAttackData,
    balance,
    model_outputs,
    run_shadow_mia,
)
from attacks.membership.threshold import best_loss_threshold, run_loss_threshold

__all__ = [
    "CLASSIFIERS",
    "FEATURES",
    "FPR_TARGETS",
    "LabeledOutputs",
    "ShadowAttackData",
    "attack_auc",
    "balance",
    "best_loss_threshold",
    "confidence",
    "cross_entropy_loss",
    "model_outputs",
    "prediction_entropy",
    "roc_summary",
    "run_loss_threshold",
    "run_shadow_mia",
    "tpr_at_fpr",
]
