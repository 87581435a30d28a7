"""Broken DP mechanisms, switchable in the real code paths, for proving that the audit detects them.

Issue 37: an audit counts only once it is shown to flag a broken mechanism at the settings the
studies run. Each fault below is a realistic bug (the kind a refactor introduces), injected where
the real mechanism computes, so that the audit sees exactly what a buggy release would look like;
the code that reports sigma, counts clips and keeps the privacy ledger is left as it is (a bug
does not announce itself).

Never in a production default: the run key ``dp-fault`` is refused unless the environment of the
process that validates the config sets ``PPFL_ALLOW_DP_FAULTS=1`` (the audit's tests and
``benchmarks/audit_detection.py`` do), and every run made with one records it in its summary.
"""

from __future__ import annotations

import os

ALLOW_ENV = "PPFL_ALLOW_DP_FAULTS"

#: fault -> what it breaks (the audit's documentation names the same classes).
FAULTS: dict[str, str] = {
    "noise-div-2": "the noise added is 2x smaller than the sigma reported and accounted",
    "noise-div-10": "the noise added is 10x smaller than the sigma reported and accounted",
    "wrong-cohort": "sigma is sized for a 10x larger cohort (the mechanism reports the sigma it used)",
    "skip-clip": "real clients' updates (and canaries on the same path) are not clipped; the clip counters "
                 "still count them",
    "clip-after-noise": "the clip is applied to the noised aggregate instead of before the noise",
    "pdp-one-client-noise-div-10": "one client's personalized noise SD (client 0's) is 10x too small",
    "dpsgd-noise-div-10": "the DP-SGD optimizer's noise multiplier is 10x smaller than the ledger's",
    "dpsgd-noise-div-2": "the DP-SGD optimizer's noise multiplier is 2x smaller than the ledger's",
}

#: the faults each study's mechanisms can carry (a study refuses the others).
FAULTS_BY_STUDY: dict[str, tuple[str, ...]] = {
    "dfl-dp": ("noise-div-2", "noise-div-10", "wrong-cohort", "skip-clip", "clip-after-noise"),
    "tabular-pdp": ("noise-div-2", "noise-div-10", "wrong-cohort", "skip-clip", "clip-after-noise",
                    "pdp-one-client-noise-div-10"),
    "ultrasound": ("dpsgd-noise-div-10", "dpsgd-noise-div-2"),
}

#: the factor by which a "noise-div-k" / "dpsgd-noise-div-k" fault shrinks the noise actually added
NOISE_DIVISOR = {"noise-div-2": 2.0, "noise-div-10": 10.0, "dpsgd-noise-div-10": 10.0, "dpsgd-noise-div-2": 2.0}
#: the cohort factor of "wrong-cohort"
WRONG_COHORT_FACTOR = 10


def faults_allowed() -> bool:
    """Whether this process may run a broken mechanism (``PPFL_ALLOW_DP_FAULTS=1``)."""
    return os.environ.get(ALLOW_ENV, "") == "1"


def check_fault(name: str, study: str | None = None) -> str:
    """``name`` if it is '' or a fault of ``study`` that this process may inject, else a ValueError saying why."""
    if not name:
        return name
    if name not in FAULTS:
        raise ValueError(f"got {name!r}; allowed: '' or one of {sorted(FAULTS)}")
    if study is not None and name not in FAULTS_BY_STUDY.get(study, ()):
        raise ValueError(f"{name!r} is not a fault of study {study!r}; its faults: "
                         f"{list(FAULTS_BY_STUDY.get(study, ()))}")
    if not faults_allowed():
        raise ValueError(f"got {name!r}: a deliberately broken DP mechanism ({FAULTS[name]}), for the audit's tests "
                         f"only; set {ALLOW_ENV}=1 in the environment of the process that runs the ServerApp "
                         "to allow it")
    return name


def noise_divisor(fault: str) -> float:
    """How much smaller than reported the added noise is under ``fault`` (1 when it does not shrink noise)."""
    return NOISE_DIVISOR.get(fault, 1.0)
