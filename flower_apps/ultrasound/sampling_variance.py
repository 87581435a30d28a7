"""Test-set sampling variance of the ultrasound results, from what each kept run folder holds.

Every seed of the ultrasound grid tests on the same small BUSI split (65-78 images, 13 normal in the
normal-vs-abnormal task), so an interval over seeds (:func:`flower_apps.common.stats.summarize`) measures
how much *training* varies on that split, not how well the number would carry to other images of the same
population. The kept runs hold the confusion matrix and the AUC but no per-image scores, so the test
sampling error is computed analytically per run:

* accuracy: binomial, ``SE^2 = p (1 - p) / n``;
* binary AUC: Hanley & McNeil (1982), Radiology 143:29-36, eq. 2, from the AUC and the two class counts
  (``Q1 = A / (2 - A)``, ``Q2 = 2 A^2 / (1 + A)``). Its Q1 / Q2 are exact for exponential score
  distributions; for binormal scores it underestimates when one class is small (BUSI's 13 normal test
  images: 0.037 against a simulated 0.046 at AUC 0.90) and overestimates with the classes swapped, so
  :func:`auc_se` takes the larger of the two orientations (in every setting simulated in the tests it
  covered the simulated spread, overestimating it by up to ~45% at AUC 0.96);
* three-class (macro one-vs-rest) AUC: not computed (the per-class AUCs are not kept, and averaging
  per-class Hanley-McNeil errors would ignore the correlation between them): reported as unavailable.

Combining the k seeds of a cell: the seeds share one test set, so their test sampling errors do not
average out. The variance of the cell's mean as an estimate of the population value is taken as

    Var = s^2 / k + mean_i(SE_i^2)

(``s``: the SD over seeds, the training spread; the second term: the test-sampling variance of a single
run, which a shared test set does not divide by k). This is conservative where the runs' test errors are
less than fully correlated. The interval is normal: ``mean +- z_{0.975} sqrt(Var)``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import norm


def accuracy_se(correct: int, n: int) -> float:
    """Binomial standard error of an accuracy of ``correct`` out of ``n`` test images."""
    if n < 1 or not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n and n >= 1, got correct={correct}, n={n}")
    p = correct / n
    return math.sqrt(p * (1.0 - p) / n)


def hanley_mcneil_se(auc: float, n_pos: int, n_neg: int) -> float:
    """Standard error of an empirical ROC AUC (Hanley & McNeil 1982, eq. 2)."""
    if not 0.0 <= auc <= 1.0:
        raise ValueError(f"auc must be in [0, 1], got {auc}")
    if n_pos < 1 or n_neg < 1:
        raise ValueError(f"need at least one image of each class, got n_pos={n_pos}, n_neg={n_neg}")
    q1 = auc / (2.0 - auc)
    q2 = 2.0 * auc * auc / (1.0 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc * auc) + (n_neg - 1) * (q2 - auc * auc)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def auc_se(auc: float, n_pos: int, n_neg: int) -> float:
    """A conservative test-sampling SE of a binary AUC: Hanley-McNeil's, the larger over the class orientations."""
    return max(hanley_mcneil_se(auc, n_pos, n_neg), hanley_mcneil_se(auc, n_neg, n_pos))


def binary_counts(confusion: Sequence[Sequence[int]]) -> tuple[int, int, int]:
    """(correct, positives, negatives) of a 2x2 confusion matrix (rows: true class; class 1 positive)."""
    if len(confusion) != 2 or any(len(row) != 2 for row in confusion):
        raise ValueError(f"need a 2x2 confusion matrix, got {confusion}")
    correct = int(confusion[0][0]) + int(confusion[1][1])
    return correct, int(sum(confusion[1])), int(sum(confusion[0]))


@dataclass(frozen=True)
class CellInterval:
    """A cell over seeds: its mean, the training-only interval and the one with test sampling added."""

    mean: float
    seeds: int
    training: tuple[float, float]  # mean +- z s / sqrt(k)
    with_test: tuple[float, float]  # mean +- z sqrt(s^2 / k + mean SE^2)
    test_se: float  # sqrt(mean SE_i^2): one run's test-sampling error

    def fmt(self, digits: int = 3) -> str:
        lo, hi = self.with_test
        return f"{self.mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def combine(values: Sequence[float], ses: Sequence[float], confidence: float = 0.95) -> CellInterval:
    """The cell's intervals from per-seed values and their test-sampling standard errors (module docstring)."""
    if len(values) != len(ses) or not values:
        raise ValueError(f"need one SE per value and at least one value, got {len(values)} and {len(ses)}")
    k = len(values)
    mean = statistics.fmean(values)
    s2 = statistics.variance(values) if k > 1 else 0.0
    test_var = statistics.fmean(se * se for se in ses)
    z = float(norm.ppf(0.5 + confidence / 2))
    half_train = z * math.sqrt(s2 / k)
    half_all = z * math.sqrt(s2 / k + test_var)
    return CellInterval(mean, k, (mean - half_train, mean + half_train), (mean - half_all, mean + half_all),
                        math.sqrt(test_var))


def run_ses(summary: dict) -> dict[str, float | None]:
    """Test-sampling SEs of a kept run's accuracy and AUC (None where the kept data cannot give one)."""
    confusion = summary["confusion"]
    n = int(sum(sum(row) for row in confusion))
    correct = int(sum(confusion[i][i] for i in range(len(confusion))))
    out: dict[str, float | None] = {"accuracy": accuracy_se(correct, n), "auc": None}
    if len(confusion) == 2 and summary.get("test_auc") is not None:
        _, pos, neg = binary_counts(confusion)
        out["auc"] = auc_se(float(summary["test_auc"]), pos, neg)
    return out
