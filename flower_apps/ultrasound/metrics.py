"""Classification metrics of the ultrasound study (scikit-learn), as pure functions of labels and scores."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_score, recall_score, roc_auc_score

METRIC_NAMES = ("accuracy", "f1", "precision", "recall", "specificity", "auc")


def specificity(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> float:
    """Binary: TN / (TN + FP) with class 1 (abnormal / malignant) as positive.
    Multi-class: macro mean of the one-vs-rest specificities."""
    cm = confusion_matrix(y_true, y_pred, labels=list(range(num_classes)))
    if num_classes == 2:
        tn, fp = cm[0, 0], cm[0, 1]
        return float(tn / (tn + fp)) if tn + fp else math.nan
    total = cm.sum()
    specs = []
    for k in range(num_classes):
        fp = cm[:, k].sum() - cm[k, k]
        tn = total - cm[k, :].sum() - fp
        if tn + fp:
            specs.append(tn / (tn + fp))
    return float(np.mean(specs)) if specs else math.nan


def classification_metrics(y_true: np.ndarray, probs: np.ndarray) -> dict:
    """Accuracy, macro F1 / precision / recall, specificity, ROC-AUC (nan when a class is absent) and
    the confusion matrix (rows: true class, columns: predicted) of class probabilities ``probs`` (n, C)."""
    y_true = np.asarray(y_true)
    probs = np.asarray(probs, dtype=float)
    if probs.ndim != 2 or len(probs) != len(y_true):
        raise ValueError(f"probs must be (n, C) with n = {len(y_true)}, got {probs.shape}")
    c = probs.shape[1]
    y_pred = probs.argmax(1)
    labels = list(range(c))
    out = {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "f1": float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "precision": float(precision_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "recall": float(recall_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "specificity": specificity(y_true, y_pred, c),
    }
    present = np.unique(y_true)
    if len(present) < c or len(present) < 2:
        out["auc"] = math.nan
    elif c == 2:
        out["auc"] = float(roc_auc_score(y_true, probs[:, 1]))
    else:
        p = probs / probs.sum(1, keepdims=True)
        out["auc"] = float(roc_auc_score(y_true, p, multi_class="ovr", average="macro", labels=labels))
    out["confusion"] = confusion_matrix(y_true, y_pred, labels=labels).tolist()
    return out
