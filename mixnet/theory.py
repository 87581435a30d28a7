"""Theory beside the measurements: min-entropy and our chain-following bound on the linking advantage.

Whom this protects against: a *passive global* network adversary (sees every frame's time,
link and size; knows K, O, mu and the learning topology) that wants to name the sender of a
fragment delivered to a receiver ``D``, optionally helped by a fraction ``c`` of relays that
collude with it. Payload content is out of scope (see the curious-recipient attack). Pure
functions of numbers only; the trace-based inputs come from :func:`mixnet.metrics.relay_min_entropy`.

**Whose formula.** The UnlinkableDFL paper (Feng et al., arXiv 2602.21343) is said (issues 17,
39) to state a Theorem 1 and a Corollary 1 with a posterior min-entropy ``H_inf`` and a quantity
``gamma_T``; its statements could not be read here (only the paper's abstract and introduction are stored
offline). The bound below is **the project's own**, the *chain-following bound*: it treats
``gamma_T`` as a probability (that of following the target's chain back to its origin). It
is not the paper's Theorem 1 (issue 39 reads the paper's ``gamma_T`` as a multiplicity of
feasible trajectories times ``2^-H_inf``); that form sits beside it in
:mod:`mixnet.theory_multiplicity`. Our statement, written out so that it can be checked
(docs/unlinkable_dfl.md, "Which formula"):

* Path length ``k ~ pi`` (``pi_k = 1/K``, the uniform case). A ``k``-hop packet
  passes ``k - 1`` relays between sender and receiver; a 1-hop packet is delivered by its
  sender itself.
* **Relay shuffle.** At an honest relay the adversary's posterior over which input left as a
  given output has min-entropy ``H_inf = -log2 max_j P(in_j | out)``. For a full batch of
  ``O`` packets released in a uniformly random order (cover on), ``H_inf = log2 O``; from a
  trace it is the *average* min-entropy ``-log2 E[max_j P(in_j | out)]`` of the Bayes
  posterior under the public hold-time model (Dodis et al.'s average min-entropy: it is the
  log of the Bayes-optimal guessing probability ``p = 2^-H_inf``).
* **Chain-following probability** ``gamma_T = sum_k pi_k p^(k-1)``: the probability that the
  adversary follows target ``T`` back to its origin (each of the ``k - 1`` relay shuffles
  guessed independently with probability at most ``p``).
* **Chain-following bound (ours).** If, whenever the chain is not followed, the adversary's
  guess is no better than uniform over the anonymity set ``U_T``, its success probability is
  at most ``gamma_T + (1 - gamma_T) / |U_T|``, so its advantage over the ``1/|U_T|`` baseline
  is ``Adv_T <= gamma_T (1 - 1/|U_T|)``.
* **With colluding relays (ours).** Each relay colludes independently with probability ``c``;
  a colluding relay reveals its input-output mapping (``H_inf = 0`` there), so each hop is
  followed with probability ``c + (1 - c) p`` and
  ``gamma_T(c) = sum_k pi_k (c + (1 - c) p)^(k-1)``; the chain-following bound holds with it.
  ``c = 0`` gives the bound above, ``c = 1`` gives ``gamma_T = 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def path_length_prior(max_path_length: int, weights: Sequence[float] | None = None) -> np.ndarray:
    """``pi_k`` for ``k = 1..K``: uniform (the paper's case) or the normalised ``weights``."""
    if not isinstance(max_path_length, int) or max_path_length < 1:
        raise ValueError(f"max_path_length must be an int >= 1, got {max_path_length!r}")
    if weights is None:
        return np.full(max_path_length, 1.0 / max_path_length)
    w = np.asarray(weights, dtype=float)
    if w.shape != (max_path_length,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {max_path_length} finite values >= 0 with a positive sum, got {weights!r}")
    return w / w.sum()


def min_entropy(probabilities: Sequence[float] | np.ndarray) -> float:
    """``H_inf = -log2 max p`` in bits of a distribution (normalised here)."""
    p = np.asarray(probabilities, dtype=float)
    if p.ndim != 1 or p.size == 0 or not np.isfinite(p).all() or (p < 0).any() or p.sum() <= 0:
        raise ValueError("probabilities must be a non-empty 1-D array of finite values >= 0 with a positive sum")
    return float(-math.log2(p.max() / p.sum()))


def ideal_relay_min_entropy(outbox_size: int) -> float:
    """``H_inf = log2 O``: a full batch of ``O`` packets released in uniformly random order."""
    if not isinstance(outbox_size, int) or outbox_size < 1:
        raise ValueError(f"outbox_size must be an int >= 1, got {outbox_size!r}")
    return math.log2(outbox_size)


def _check_h(h_inf: float) -> None:
    if not (math.isfinite(h_inf) and h_inf >= 0):
        raise ValueError(f"h_inf must be a finite number of bits >= 0, got {h_inf}")


def _check_c(compromised: float) -> None:
    if not 0 <= compromised <= 1:
        raise ValueError(f"compromised must be a fraction in [0, 1], got {compromised}")


def chain_following_gamma(h_inf: float, prior: Sequence[float] | np.ndarray, compromised: float = 0.0) -> float:
    """Chain-following probability (ours) ``gamma_T = sum_k pi_k (c + (1 - c) 2^-H_inf)^(k-1)``.

    A probability in ``(0, 1]``; ``c > 0`` adds colluding relays (module docstring).

    Parameters
    ----------
    h_inf
        Per-relay posterior min-entropy in bits.
    prior
        Path-length prior ``pi_1..pi_K`` (:func:`path_length_prior`).
    compromised
        Fraction ``c`` of relays colluding with the adversary.

    Returns
    -------
    float
        ``gamma_T``, the probability of following the target's chain back to its origin.
    """
    _check_h(h_inf)
    _check_c(compromised)
    pi = np.asarray(prior, dtype=float)
    if pi.ndim != 1 or pi.size == 0 or (pi < 0).any() or not math.isclose(float(pi.sum()), 1.0, rel_tol=1e-9):
        raise ValueError(f"prior must be a probability vector over path lengths 1..K, got {prior!r}")
    per_hop = compromised + (1.0 - compromised) * 2.0 ** (-h_inf)
    return float(sum(p * per_hop**k for k, p in enumerate(pi)))


def chain_following_bound(gamma: float, anonymity_sizes: Sequence[int] | np.ndarray) -> float:
    """Chain-following bound (ours): mean over targets of ``gamma_T (1 - 1/|U_T|)``.

    ``anonymity_sizes`` are the ``|U_T|`` of the scored targets (the same sets as the
    measured baseline ``mean 1/|U_T|``), so bound and measurement share one baseline.
    """
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be a probability, got {gamma}")
    sizes = np.asarray(anonymity_sizes, dtype=float)
    if sizes.ndim != 1 or sizes.size == 0 or (sizes < 1).any():
        raise ValueError("anonymity_sizes must be a non-empty list of set sizes >= 1")
    return float(gamma * (1.0 - np.mean(1.0 / sizes)))


@dataclass(frozen=True)
class TheoryRow:
    """Our chain-following theory of one mixnet configuration, ready to sit beside its measured advantage."""

    h_inf_bits: float  # per-relay min-entropy used
    gamma: float  # chain-following probability gamma_T (c = 0)
    bound: float  # chain-following bound on the advantage
    gamma_compromised: dict[float, float]  # colluding relays: c -> gamma_T(c)
    bound_compromised: dict[float, float]  # c -> chain-following bound

    def as_dict(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}_h_inf_bits": self.h_inf_bits, f"{prefix}_gamma": self.gamma, f"{prefix}_bound": self.bound}
        for c in self.gamma_compromised:
            out[f"{prefix}_gamma_c{c:g}"] = self.gamma_compromised[c]
            out[f"{prefix}_bound_c{c:g}"] = self.bound_compromised[c]
        return out


def theory_row(h_inf: float, prior: Sequence[float] | np.ndarray, anonymity_sizes: Sequence[int] | np.ndarray,
               compromised: Sequence[float] = (0.1, 0.25)) -> TheoryRow:
    """The chain-following bound (ours), without and with colluding relays, for one configuration."""
    gamma = chain_following_gamma(h_inf, prior)
    gc = {float(c): chain_following_gamma(h_inf, prior, float(c)) for c in compromised}
    return TheoryRow(h_inf, gamma, chain_following_bound(gamma, anonymity_sizes), gc,
                     {c: chain_following_bound(g, anonymity_sizes) for c, g in gc.items()})
