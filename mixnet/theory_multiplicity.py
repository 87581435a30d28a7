"""The multiplicity form of ``gamma_T``: feasible trajectories times ``2^-H_inf`` (issue 39's reading of the paper).

Whom this protects against: the same passive global network adversary as :mod:`mixnet.theory`
(every frame's time, link and size; public K, O, mu; optionally the learning topology) naming
the sender of a fragment delivered to ``D``. Pure functions of numbers; the trajectory counts
come from :func:`attacks.linking.trajectories.trajectory_counts`.

**Provenance, stated plainly.** The UnlinkableDFL paper (Feng et al., arXiv 2602.21343) is said
(issues 17, 39) to give a Theorem 1 with a quantity ``gamma_T`` and a posterior min-entropy
``H_inf``; the statement itself could not be read here (only its abstract and introduction are stored offline). Issue 39 reads the
paper's ``gamma_T`` as *a multiplicity of feasible trajectories times* ``2^-H_inf``, against our
chain-following bound (:func:`mixnet.theory.chain_following_gamma`), where ``gamma_T`` is a
probability. This module computes that reading from the trace, and only that:

* ``Gamma_T``: the trajectories consistent with the adversary's trace that end in target
  ``T``'s delivery to ``D`` (chains of at most ``K`` observed packet frames, each arriving at a
  node within the hold-time horizon before the next leaves it, whose origin is in the anonymity
  set ``U_T``). The true trajectory is one of them, so ``|Gamma_T| >= 1``.
* ``gamma_T = |Gamma_T| 2^-H_inf`` with ``H_inf`` the per-relay min-entropy (ideal ``log2 O``
  or the trace's average min-entropy, as in :mod:`mixnet.theory`).
* the bound as read: ``Adv_T <= gamma_T``, averaged over the same targets as the measured
  advantage.

``gamma_T`` here is a count times a probability, not a probability: it exceeds 1 as soon as
more trajectories are feasible than ``2^H_inf``, and the bound then says nothing. How often a
target's ``gamma_T`` stays below 1 is reported (``informative``). Where the two forms differ:
with ``K = 2``, ``H_inf = log2 10`` and 3 feasible trajectories, ours gives
``gamma_T = 1/2 + 1/2 * 1/10 = 0.55`` and this form ``3 / 10 = 0.3``; with 30 trajectories,
``3.0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def _check_h(h_inf: float) -> None:
    if not (math.isfinite(h_inf) and h_inf >= 0):
        raise ValueError(f"h_inf must be a finite number of bits >= 0, got {h_inf}")


def _counts(trajectory_counts: Sequence[float] | np.ndarray) -> np.ndarray:
    n = np.asarray(trajectory_counts, dtype=float)
    # >= 1 in every real case (the true trajectory is feasible); 0 only if the true chain fell outside
    # the adversary's horizon, which is the attack model's miss, not an input error
    if n.ndim != 1 or n.size == 0 or not np.isfinite(n).all() or (n < 0).any():
        raise ValueError("trajectory_counts must be a non-empty list of finite counts >= 0")
    return n


def multiplicity_gamma(trajectories: float, h_inf: float) -> float:
    """``gamma_T = |Gamma_T| 2^-H_inf`` for one target (issue 39's reading of the paper's ``gamma_T``).

    Parameters
    ----------
    trajectories
        ``|Gamma_T|``: trajectories consistent with the trace that end in the target.
    h_inf
        Per-relay posterior min-entropy in bits.

    Returns
    -------
    float
        ``gamma_T``; not a probability, it may exceed 1.
    """
    _check_h(h_inf)
    return float(_counts([trajectories])[0] * 2.0 ** (-h_inf))


def multiplicity_bound(trajectory_counts: Sequence[float] | np.ndarray, h_inf: float) -> float:
    """The bound as read, ``Adv_T <= gamma_T``, averaged over the scored targets.

    Parameters
    ----------
    trajectory_counts
        ``|Gamma_T|`` of each scored target (the same targets as the measured advantage).
    h_inf
        Per-relay posterior min-entropy in bits.

    Returns
    -------
    float
        ``mean_T |Gamma_T| 2^-H_inf`` (uncapped, so that a vacuous bound shows as > 1).
    """
    _check_h(h_inf)
    return float(np.mean(_counts(trajectory_counts)) * 2.0 ** (-h_inf))


@dataclass(frozen=True)
class MultiplicityRow:
    """The multiplicity form for one configuration, ready to sit beside its measured advantage."""

    h_inf_bits: float  # per-relay min-entropy used
    mean_trajectories: float  # mean |Gamma_T| over the scored targets
    bound: float  # mean gamma_T = mean |Gamma_T| 2^-H_inf (the bound on the advantage, as read)
    informative: float  # fraction of targets with gamma_T < 1 (where the form bounds anything)
    informative_advantage: float  # measured advantage on those targets alone (nan if none or not given)
    informative_bound: float  # mean gamma_T on those targets (nan if none)

    def as_dict(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}_mult_h_inf_bits": self.h_inf_bits, f"{prefix}_mult_trajectories": self.mean_trajectories,
                f"{prefix}_mult_bound": self.bound, f"{prefix}_mult_informative": self.informative,
                f"{prefix}_mult_informative_advantage": self.informative_advantage,
                f"{prefix}_mult_informative_bound": self.informative_bound}


def multiplicity_row(trajectory_counts: Sequence[float] | np.ndarray, h_inf: float,
                     hits: Sequence[float] | np.ndarray | None = None,
                     baselines: Sequence[float] | np.ndarray | None = None) -> MultiplicityRow:
    """:class:`MultiplicityRow` from the targets' trajectory counts and a per-relay ``H_inf``.

    Parameters
    ----------
    trajectory_counts
        ``|Gamma_T|`` per scored target.
    h_inf
        Per-relay posterior min-entropy in bits.
    hits, baselines
        Optional, per target in the same order: 1 where the adversary named the true sender, and
        ``1/|U_T|``. With them the row also gives the measured advantage on the targets whose
        ``gamma_T < 1``: if ``Adv_T <= gamma_T`` held target by target, that advantage would be at most
        their mean ``gamma_T`` (the one place where this form can be checked at all).

    Returns
    -------
    MultiplicityRow
    """
    n = _counts(trajectory_counts)
    _check_h(h_inf)
    gamma = n * 2.0 ** (-h_inf)
    small = gamma < 1
    adv_small = bound_small = float("nan")
    if small.any():
        bound_small = float(gamma[small].mean())
        if hits is not None and baselines is not None:
            h, b = np.asarray(hits, dtype=float), np.asarray(baselines, dtype=float)
            if h.shape != n.shape or b.shape != n.shape:
                raise ValueError("hits and baselines must have one value per target")
            adv_small = float(h[small].mean() - b[small].mean())
    return MultiplicityRow(h_inf, float(n.mean()), float(gamma.mean()), float(small.mean()), adv_small, bound_small)
