"""Membership inference: shadow-model attack, loss-threshold baseline and offline LiRA."""

from attacks.membership.features import FEATURES, confidence, cross_entropy_loss, prediction_entropy
from attacks.membership.lira import (
    lira_offline_scores,
    logit_confidence,
    reference_subsets,
    regression_statistic,
    run_offline_lira,
)
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
    "lira_offline_scores",
    "logit_confidence",
    "model_outputs",
    "prediction_entropy",
    "reference_subsets",
    "regression_statistic",
    "roc_summary",
    "run_loss_threshold",
    "run_offline_lira",
    "run_shadow_mia",
    "tpr_at_fpr",
]
