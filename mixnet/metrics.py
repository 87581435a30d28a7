"""Anonymity metrics of the UnlinkableDFL transport.

* ``H_relay = log2 O``: one hidden shuffle of a full outbox of ``O`` packets.
* ``H_path = log2 sum_{k=1..K} O^k``: the paper's uniform special case, where a
  packet's path takes ``k`` hidden shuffles with every length equally likely.
* ``H_relay^loc`` (:func:`relay_mapping_entropy`): a per-relay Shannon
  diagnostic computed from what the passive adversary actually observes. For
  each packet leaving relay ``R`` at ``t_out``, the adversary weighs every packet
  that arrived at ``R`` before it by the likelihood of the hold time
  ``t_out - t_in`` under the public delay model (fill wait ``~ U(0, F)`` plus
  ``Exp(mu)``), normalises, and takes the Shannon entropy of that
  output-to-input distribution. The mean over outputs is reported. It is
  ``<= log2(#candidates)``; it falls short of ``H_relay`` when batches are not
  full or timing gives inputs away.

Attack/diagnostic functions receive only an :class:`~mixnet.trace.AdversaryView`;
ground truth enters only in :func:`relay_linking_accuracy`, which scores them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .trace import AdversaryView, GroundTruth


def h_relay(outbox_size: int) -> float:
    """``log2 O`` bits per hidden shuffle."""
    if not isinstance(outbox_size, int) or outbox_size < 1:
        raise ValueError(f"outbox_size must be an int >= 1, got {outbox_size!r}")
    return math.log2(outbox_size)


def h_path(outbox_size: int, max_path_length: int) -> float:
    """``log2 sum_{k=1..K} O^k`` (uniform path lengths, full batches)."""
    if not isinstance(outbox_size, int) or outbox_size < 1:
        raise ValueError(f"outbox_size must be an int >= 1, got {outbox_size!r}")
    if not isinstance(max_path_length, int) or max_path_length < 1:
        raise ValueError(f"max_path_length must be an int >= 1, got {max_path_length!r}")
    return math.log2(sum(outbox_size**k for k in range(1, max_path_length + 1)))


def shannon_entropy(probabilities: Sequence[float] | np.ndarray) -> float:
    """Shannon entropy in bits of a distribution (normalised here; zeros ignored)."""
    p = np.asarray(probabilities, dtype=float)
    if p.ndim != 1 or p.size == 0 or np.any(p < 0) or not np.isfinite(p).all() or p.sum() <= 0:
        raise ValueError("probabilities must be a non-empty 1-D array of finite values >= 0 with a positive sum")
    p = p[p > 0] / p.sum()
    return float(-(p * np.log2(p)).sum())


def hold_time_density(t: np.ndarray, mu: float, fill_timeout: float) -> np.ndarray:
    """Density of ``U(0, F) + Exp(mean mu)`` at ``t`` (just ``Exp(mu)`` when ``F = 0``)."""
    t = np.asarray(t, dtype=float)
    lam = 1.0 / mu
    out = np.zeros_like(t)
    pos = t >= 0
    if fill_timeout <= 0:
        out[pos] = lam * np.exp(-lam * t[pos])
        return out
    f = fill_timeout
    inside = pos & (t <= f)
    after = t > f
    out[inside] = (1 - np.exp(-lam * t[inside])) / f
    out[after] = (np.exp(-lam * (t[after] - f)) - np.exp(-lam * t[after])) / f
    return out


@dataclass(frozen=True)
class RelayEntropy:
    relay: int
    mean_bits: float
    outputs: int
    mean_candidates: float
    per_output_bits: tuple[float, ...]


def _relay_io(view: AdversaryView, relay: int) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    ins, outs, in_idx, out_idx = [], [], [], []
    for i, r in enumerate(view.records):
        if r.size != view.packet_frame_size:
            continue
        if r.dst == relay and r.arrival is not None:
            ins.append(r.arrival)
            in_idx.append(i)
        elif r.src == relay:
            outs.append(r.time)
            out_idx.append(i)
    order = np.argsort(ins, kind="stable")
    return np.asarray(ins)[order], np.asarray(outs), [in_idx[k] for k in order], out_idx


def _posteriors(view: AdversaryView, relay: int, horizon: float | None):
    ins, outs, in_idx, out_idx = _relay_io(view, relay)
    horizon = view.fill_timeout + 20 * view.mu if horizon is None else horizon
    for t_out, j in zip(outs, out_idx):
        lo, hi = np.searchsorted(ins, t_out - horizon), np.searchsorted(ins, t_out, side="right")
        if hi <= lo:
            continue
        w = hold_time_density(t_out - ins[lo:hi], view.mu, view.fill_timeout)
        if w.sum() <= 0:
            continue
        yield j, in_idx[lo:hi], w / w.sum()


def relay_mapping_entropy(view: AdversaryView, relay: int, horizon: float | None = None) -> RelayEntropy:
    """``H_relay^loc`` of one relay from the adversary's trace (see module docstring).

    Parameters
    ----------
    view
        The adversary's observation.
    relay
        Node whose output-to-input mapping is assessed.
    horizon
        Inputs older than this (seconds) are not candidates (default ``F + 20 mu``).
    """
    bits, sizes = [], []
    for _, candidates, p in _posteriors(view, relay, horizon):
        bits.append(shannon_entropy(p))
        sizes.append(len(candidates))
    mean = float(np.mean(bits)) if bits else 0.0
    return RelayEntropy(relay, mean, len(bits), float(np.mean(sizes)) if sizes else 0.0, tuple(bits))


def relay_linking_accuracy(
    view: AdversaryView, truth: GroundTruth, relay: int, horizon: float | None = None
) -> tuple[float, float, int]:
    """Score the timing adversary at ``relay`` against the truth.

    Returns ``(top-1 accuracy, mean posterior on the true input, relayed outputs scored)``
    over outputs that really were relayed packets.
    """
    hits, mass, n = 0, 0.0, 0
    for j, candidates, p in _posteriors(view, relay, horizon):
        true_in = truth.records[j].in_ref
        if true_in is None:
            continue
        n += 1
        if true_in in candidates:
            k = candidates.index(true_in)
            mass += float(p[k])
            hits += int(np.argmax(p) == k)
    return (hits / n if n else 0.0, mass / n if n else 0.0, n)


@dataclass(frozen=True)
class RelayMinEntropy:
    """Average posterior min-entropy of relay shuffles, from the trace."""

    guess_probability: float  # E[max_j P(in_j | out)]: the Bayes-optimal per-hop guess
    h_inf_bits: float  # -log2 of it (average min-entropy)
    outputs: int  # outputs it averages over


def relay_min_entropy(
    view: AdversaryView, relays: Sequence[int] | None = None, truth: GroundTruth | None = None,
    horizon: float | None = None, topology: Sequence[Sequence[int]] | None = None,
) -> RelayMinEntropy:
    """``H_inf`` of the relays' output-to-input mappings as the passive adversary sees them.

    For every packet leaving a relay, the adversary's posterior over the relay's earlier
    inputs (hold-time likelihood, as in :func:`relay_mapping_entropy`) has a largest mass
    ``max_j P``; its mean is the Bayes-optimal probability of guessing a hop, and
    ``H_inf = -log2`` of that mean (average min-entropy). ``truth`` (scoring side only)
    restricts the mean to outputs that really were relayed packets, the hops that stand
    between a delivered fragment and its sender; without it, every output counts.

    ``topology`` (the public learning graph) models an adversary that also knows a fragment
    to ``X`` comes from one of ``X``'s neighbours: per output to ``X`` the guess is the larger
    of the plain posterior's maximum and that of the posterior restricted to inputs sent by
    ``X``'s neighbours (side information can only sharpen the guess, so the larger is kept).
    """
    nodes = sorted({r.src for r in view.records}) if relays is None else list(relays)
    best: list[float] = []
    for relay in nodes:
        for j, candidates, p in _posteriors(view, relay, horizon):
            if truth is not None and truth.records[j].kind != "relay":
                continue
            guess = float(p.max())
            if topology is not None:
                out_dst = view.records[j].dst
                allowed = set(topology[out_dst]) if out_dst < len(topology) else set()
                mask = np.asarray([view.records[i].src in allowed for i in candidates])
                if mask.any() and p[mask].sum() > 0:
                    guess = max(guess, float(p[mask].max() / p[mask].sum()))
            best.append(guess)
    if not best:
        return RelayMinEntropy(1.0, 0.0, 0)
    g = float(np.mean(best))
    return RelayMinEntropy(g, float(-math.log2(g)), len(best))
