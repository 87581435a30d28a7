"""Membership inference: shadow-free and shadow-model attacks behind one runner, and offline LiRA.

Pick an attack by name from :data:`MEMBERSHIP_ATTACKS` and call
:func:`run_membership_attack` with the model and its member / non-member ``(x, y)``
sets (:mod:`attacks.membership.runners`). Shadow-free attacks (``loss``,
``confidence``, ``entropy``, ``modified-entropy``) need no shadow federation;
``shadow-<feature>-<classifier>`` attacks also take :class:`ShadowSets`.
:func:`run_shadow_mia` and :func:`run_loss_threshold` produce the paper-protocol rows
(balanced subsets) of the dfl-dp and ultrasound studies.
"""

from attacks.membership.features import (
    FEATURES,
    confidence,
    cross_entropy_loss,
    modified_entropy,
    prediction_entropy,
)
from attacks.membership.lira import (
    lira_offline_scores,
    logit_confidence,
    reference_subsets,
    regression_statistic,
    run_offline_lira,
)
from attacks.membership.roc import FPR_TARGETS, attack_auc, roc_summary, tpr_at_fpr
from attacks.membership.runners import (
    MEMBERSHIP_ATTACKS,
    MembershipAttack,
    MembershipAttackResult,
    ShadowSets,
    evaluate_scores,
    get_membership_attack,
    register_membership_attack,
    run_membership_attack,
    run_membership_attack_on_outputs,
    shadow_free_attacks,
)
from attacks.membership.shadow import (
    CLASSIFIERS,
    LabeledOutputs,
    MembershipOutputs,
    ShadowAttackData,
    balance,
    balance_members,
    fit_shadow_scorer,
    model_outputs,
    run_shadow_mia,
)
from attacks.membership.threshold import best_loss_threshold, best_score_threshold, run_loss_threshold

__all__ = [
    "CLASSIFIERS",
    "FEATURES",
    "FPR_TARGETS",
    "LabeledOutputs",
    "MEMBERSHIP_ATTACKS",
    "MembershipAttack",
    "MembershipAttackResult",
    "MembershipOutputs",
    "ShadowAttackData",
    "ShadowSets",
    "attack_auc",
    "balance",
    "balance_members",
    "best_loss_threshold",
    "best_score_threshold",
    "confidence",
    "cross_entropy_loss",
    "evaluate_scores",
    "fit_shadow_scorer",
    "get_membership_attack",
    "lira_offline_scores",
    "logit_confidence",
    "model_outputs",
    "modified_entropy",
    "prediction_entropy",
    "reference_subsets",
    "register_membership_attack",
    "regression_statistic",
    "roc_summary",
    "run_loss_threshold",
    "run_membership_attack",
    "run_membership_attack_on_outputs",
    "run_offline_lira",
    "run_shadow_mia",
    "shadow_free_attacks",
    "tpr_at_fpr",
]
