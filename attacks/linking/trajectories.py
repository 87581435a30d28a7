"""Feasible trajectories of a target frame: how many chains of observed frames could have delivered it.

Whom it models: the passive global network adversary of :mod:`attacks.linking.timing` (it sees
only :class:`~mixnet.trace.AdversaryView`). The count feeds the multiplicity form of ``gamma_T``
(:mod:`mixnet.theory_multiplicity`, issue 39's reading of the paper's Theorem 1).

A trajectory of target ``f`` (the frame delivering a packet to ``D``) is a chain
``g_1 -> g_2 -> ... -> g_k = f`` of ``k <= K`` packet frames in which each ``g_i`` arrived at
the node that sent ``g_(i+1)``, within the hold-time horizon ``F + 20 mu`` before it left, with
positive hold-time likelihood, and not from ``g_(i+1)``'s next hop: exactly the chains over which
the flow-correlation attack spreads its posterior (its ``_origin`` recursion), so the origins of
the trajectories are the attack's trace-consistent candidates ``C_T``. Counted per origin,
recursively (``N(f, 1) = [src f]``, ``N(f, b) = [src f] + sum_g N(g, b - 1)``), then summed over
the origins in the attack's anonymity set ``U_T`` (so ``D`` itself never counts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attacks.linking.timing import LinkingGuess, _TraceIndex
from mixnet.trace import AdversaryView


def _per_origin(index: _TraceIndex, frame: int, hops: int, memo: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
    key = (frame, hops)
    if key in memo:
        return memo[key]
    n = np.zeros(index.n_nodes)
    n[index.view.records[frame].src] = 1.0  # the chain that starts at this frame's sender
    if hops > 1:
        idx, w = index.inputs(frame)
        for g in idx[w > 0]:
            n = n + _per_origin(index, int(g), hops - 1, memo)
    memo[key] = n
    return n


def trajectory_counts(view: AdversaryView, guesses: Sequence[LinkingGuess]) -> np.ndarray:
    """``|Gamma_T|`` of each guessed target: feasible trajectories whose origin is in its ``U_T``.

    Parameters
    ----------
    view
        The adversary's observation (nothing else about the run is used).
    guesses
        The attack's answers (:func:`attacks.linking.timing.flow_correlation_attack`): each gives the
        target frame and its anonymity set ``U_T`` (topology-aware or not, as the attack was run).

    Returns
    -------
    numpy.ndarray
        One count per guess, ``>= 1`` whenever the true sender is in ``U_T``; float, since a long
        ``K`` multiplies counts per hop.
    """
    index = _TraceIndex(view)
    memo: dict[tuple[int, int], np.ndarray] = {}
    out = np.zeros(len(guesses))
    for i, g in enumerate(guesses):
        per = _per_origin(index, g.target, view.max_path_length, memo)
        out[i] = float(sum(per[s] for s in g.anonymity if s < per.size))
    return out
