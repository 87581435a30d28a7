"""Sender linking by a passive global adversary: flow correlation and trace-consistent candidate sets.

The adversary sees only :class:`~mixnet.trace.AdversaryView` (for every frame:
send time, link, size, arrival; plus the public K, O, mu and fill timeout) and,
optionally, the public learning topology. For a *target* frame (the last link of a
fragment packet, i.e. its delivery to the receiver ``D``), it must name the node that
originated the packet.

**Flow-correlation attack.** The frame ``f`` on link ``R -> D`` left relay ``R`` at
``t``. Under the public model, a packet's path length is ``k ~ Uniform{1..K}`` and a
node holds every packet for ``U(0, F) + Exp(mu)`` before release. Working backwards,
with ``b`` hops still possible::

    P_f,b(origin) = (1 / b) [R] + (1 - 1 / b) sum_g w(g | f) P_g,b-1(origin),

where ``g`` ranges over the packet frames that arrived at ``R`` within the horizon
``F + 20 mu`` before ``t`` (not from ``D``), ``w(g | f)`` is proportional to the
hold-time density of ``t - arrival(g)``, and ``P_g,1 = [src(g)]``. The guess is the
most probable origin in the candidate set.

**Anonymity set** ``U_T`` of a target: the nodes other than ``D`` that put packets on
the wire in the ``K`` horizons before the delivery (the possible senders before any
flow analysis); a topology-aware adversary keeps only ``D``'s learning neighbours
(fragments go to neighbours). The random-guess baseline is ``1 / |U_T|``.

**Trace-consistent candidate set** ``C_T <= U_T``: the nodes from which a chain of at
most ``K`` observed frames, each arriving before the next leaves (within the horizon),
reaches the target: the support of ``P_f,K`` within ``U_T``. Without a mixnet it is the
sender alone; ``|C_T|`` measures how far the trace alone narrows ``U_T``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mixnet.metrics import hold_time_density
from mixnet.trace import AdversaryView


@dataclass(frozen=True)
class LinkingGuess:
    """The adversary's answer for one target frame."""

    target: int  # index into view.records
    guess: int
    anonymity: frozenset[int]  # U_T
    candidates: frozenset[int]  # C_T (trace-consistent)
    posterior: float  # posterior mass of the guess


class _TraceIndex:
    """Per node, packet frames that arrived there, sorted by arrival."""

    def __init__(self, view: AdversaryView) -> None:
        self.view = view
        self.n_nodes = 1 + max((max(r.src, r.dst) for r in view.records), default=0)
        arrivals: dict[int, list[tuple[float, int]]] = {}
        for i, r in enumerate(view.records):
            if r.size == view.packet_frame_size and r.arrival is not None:
                arrivals.setdefault(r.dst, []).append((r.arrival, i))
        self.t_in: dict[int, np.ndarray] = {}
        self.idx_in: dict[int, np.ndarray] = {}
        for node, items in arrivals.items():
            items.sort()
            self.t_in[node] = np.asarray([a for a, _ in items])
            self.idx_in[node] = np.asarray([i for _, i in items], dtype=np.int64)
        self.src = np.asarray([r.src for r in view.records], dtype=np.int64)
        self.horizon = view.fill_timeout + 20 * view.mu
        packets = [(r.time, r.src) for r in view.records if r.size == view.packet_frame_size]
        packets.sort()
        self.t_out = np.asarray([t for t, _ in packets])
        self.src_out = np.asarray([s for _, s in packets], dtype=np.int64)

    def active(self, t: float, window: float) -> set[int]:
        """Nodes that sent a packet frame in ``[t - window, t]``."""
        lo, hi = np.searchsorted(self.t_out, t - window), np.searchsorted(self.t_out, t, side="right")
        return set(np.unique(self.src_out[lo:hi]).tolist())

    def inputs(self, frame: int) -> tuple[np.ndarray, np.ndarray]:
        """(frame indices, weights) of the packets that may have left as ``frame``."""
        r = self.view.records[frame]
        times = self.t_in.get(r.src)
        if times is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        lo, hi = np.searchsorted(times, r.time - self.horizon), np.searchsorted(times, r.time, side="right")
        idx = self.idx_in[r.src][lo:hi]
        keep = self.src[idx] != r.dst  # a relay's predecessor is never the packet's next hop on the path
        idx = idx[keep]
        w = hold_time_density(r.time - times[lo:hi][keep], self.view.mu, self.view.fill_timeout)
        return idx, w


def _origin(index: _TraceIndex, frame: int, hops: int, memo: dict) -> np.ndarray:
    key = (frame, hops)
    if key in memo:
        return memo[key]
    r = index.view.records[frame]
    p = np.zeros(index.n_nodes)
    p[r.src] = 1.0
    if hops > 1:
        idx, w = index.inputs(frame)
        if len(idx) and w.sum() > 0:
            w = w / w.sum()
            if hops == 2:  # the predecessor's origin is its own sender: one bincount
                back = np.bincount(index.src[idx], weights=w, minlength=index.n_nodes)
            else:
                back = sum(wi * _origin(index, int(g), hops - 1, memo) for g, wi in zip(idx, w) if wi > 0)
            p = p / hops + (1 - 1 / hops) * back
    memo[key] = p
    return p


def flow_correlation_attack(
    view: AdversaryView,
    targets: Sequence[int],
    neighbours: Sequence[Sequence[int]] | None = None,
    rng: np.random.Generator | None = None,
) -> list[LinkingGuess]:
    """Guess the origin of each target frame (see module docstring).

    Parameters
    ----------
    view
        The adversary's observation (nothing else about the run is used).
    targets
        Indices into ``view.records`` of the frames to attribute.
    neighbours
        Public learning topology (``neighbours[d]`` = the nodes that send fragments to
        ``d``); None for a topology-agnostic adversary.
    rng
        Breaks ties and picks uniformly when the posterior has no mass in ``U_T``.
    """
    rng = rng or np.random.default_rng(0)
    index = _TraceIndex(view)
    memo: dict = {}
    out = []
    for t in targets:
        r = view.records[t]
        if r.size != view.packet_frame_size or r.arrival is None:
            raise ValueError(f"target {t} is not a delivered packet frame")
        p = _origin(index, t, view.max_path_length, memo).copy()
        p[r.dst] = 0.0
        anonymity = index.active(r.time, view.max_path_length * index.horizon) | {r.src}
        if neighbours is not None:
            anonymity &= set(neighbours[r.dst]) if r.dst < len(neighbours) else set()
        anonymity.discard(r.dst)
        cands = set(np.flatnonzero(p > 0).tolist()) & anonymity or set(anonymity)
        if not cands:
            out.append(LinkingGuess(t, -1, frozenset(anonymity), frozenset(), 0.0))
            continue
        ordered = sorted(cands)
        mass = np.asarray([p[c] for c in ordered])
        if mass.sum() <= 0:
            guess = int(rng.choice(ordered))
        else:
            best = np.flatnonzero(mass == mass.max())
            guess = ordered[int(rng.choice(best))]
        total = p[ordered].sum()
        out.append(LinkingGuess(t, guess, frozenset(anonymity), frozenset(ordered),
                                float(p[guess] / total) if total > 0 else 0.0))
    return out
