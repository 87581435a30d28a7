"""Curious-recipient content linking (a boundary test, outside the network-layer guarantee).

Threat model: the recipient is honest-but-curious. It decrypts the fragments delivered
to it (no sender identity, as the mixnet guarantees) and tries to link them to senders
by their *content*. As a worst case it holds, for round 1, each neighbour's full update
with its identity (its reference). From round 2 on it gets anonymous fragments (a
fraction r of each sender's ranges) and, for each fragment ``[a, b)`` with values ``v``,
forms the difference ``v - w_local[a:b]`` to its own local model of that round and
compares it by cosine similarity with:

* **identity linking**: each sender's round-1 reference difference ``w_s(1) - w_local(1)``
  restricted to ``[a, b)`` (static fingerprints);
* **bucket tracking**: one bucket per sender, seeded by the reference and updated with
  the differences assigned to it (tracking fingerprints across rounds).

Fragments of one range in one round come from distinct senders, so they are assigned
jointly (Hungarian assignment on the cosine similarities; scipy). Ground truth (who
sent each fragment) only meets the guesses in :func:`score_content_linking`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from privacy.fragments import Fragment, FragmentLayout, InvalidFragment, decode


@dataclass(frozen=True)
class RoundObservation:
    """What the recipient holds in one round: its local model and the anonymous fragments."""

    round: int
    local: np.ndarray
    fragments: tuple[Fragment, ...]


@dataclass(frozen=True)
class CuriousRecipientView:
    """The recipient's whole view: identified round-1 references, then anonymous rounds."""

    reference: dict[int, np.ndarray]  # sender id -> its full round-1 state (with identity)
    reference_local: np.ndarray  # the recipient's own round-1 local state
    rounds: tuple[RoundObservation, ...]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with each row of ``b``."""
    an = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    bn = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return an @ bn.T


def _assign(sim: np.ndarray) -> np.ndarray:
    """Column chosen for each row: a one-to-one assignment when possible, else argmax."""
    if sim.shape[0] <= sim.shape[1]:
        rows, cols = linear_sum_assignment(-sim)
        out = np.empty(sim.shape[0], dtype=int)
        out[rows] = cols
        return out
    return sim.argmax(axis=1)


def link_by_content(view: CuriousRecipientView) -> list[list[tuple[int, int]]]:
    """Per round, per fragment (in the view's order): ``(identity guess, bucket guess)``."""
    senders = sorted(view.reference)
    if not senders:
        return [[(-1, -1)] * len(obs.fragments) for obs in view.rounds]
    ref = np.stack([view.reference[s] - view.reference_local for s in senders]).astype(np.float64)
    buckets = ref.copy()
    out = []
    for obs in view.rounds:
        guesses = [(-1, -1)] * len(obs.fragments)
        by_range: dict[tuple[int, int], list[int]] = {}
        for k, f in enumerate(obs.fragments):
            by_range.setdefault((f.start, f.stop), []).append(k)
        updates = []
        for (a, b), ks in by_range.items():
            diffs = np.stack([obs.fragments[k].values.astype(np.float64) - obs.local[a:b] for k in ks])
            ident = _assign(_cos(diffs, ref[:, a:b]))
            track = _assign(_cos(diffs, buckets[:, a:b]))
            for j, k in enumerate(ks):
                guesses[k] = (senders[ident[j]], senders[track[j]])
                updates.append((track[j], a, b, diffs[j]))
        for col, a, b, diff in updates:  # fingerprints move on after the whole round is assigned
            buckets[col, a:b] = diff
        out.append(guesses)
    return out


def score_content_linking(guesses: list[list[tuple[int, int]]], truth: list[list[int]],
                          num_senders: int) -> dict[str, float]:
    """Identity-linking and bucket-tracking accuracy against the true senders (chance = 1/senders)."""
    pairs = [(g, s) for gr, tr in zip(guesses, truth, strict=True) for g, s in zip(gr, tr, strict=True)]
    n = len(pairs)
    return {
        "identity_accuracy": sum(g[0] == s for g, s in pairs) / n if n else float("nan"),
        "bucket_accuracy": sum(g[1] == s for g, s in pairs) / n if n else float("nan"),
        "chance": 1.0 / num_senders if num_senders else float("nan"),
        "fragments": n,
        "senders": num_senders,
    }


@dataclass
class CuriousRecipientRecorder:
    """Harness: collects the recipient's view (and, apart, the truth) during a run."""

    node: int
    layout: FragmentLayout
    _round1: dict[int, np.ndarray] = field(default_factory=dict)
    _local: dict[int, np.ndarray] = field(default_factory=dict)
    _received: dict[int, list[Fragment]] = field(default_factory=dict)
    _truth: dict[int, list[int]] = field(default_factory=dict)

    def observe_sender(self, round_: int, sender: int, fragments: list[bytes]) -> None:
        """Round 1: a sender's full encoded update (the reference, decoded as the recipient would)."""
        if round_ != 1 or sender == self.node:
            return
        parts = [decode(b)[0] for b in fragments]
        vec = np.zeros(self.layout.num_values, dtype=np.float32)
        for f in parts:
            vec[f.start : f.stop] = f.values
        self._round1[sender] = vec

    def observe_recipient(self, round_: int, local: np.ndarray, payloads: list[bytes], senders: list[int]) -> None:
        """The recipient's local state and decrypted inbox of a round (``senders``: truth, kept apart)."""
        self._local[round_] = np.asarray(local, dtype=np.float32)
        frags, truth = [], []
        for data, s in zip(payloads, senders, strict=True):
            try:
                f, _ = decode(data)
            except InvalidFragment:
                continue
            if f.round == round_:
                frags.append(f)
                truth.append(s)
        self._received[round_] = frags
        self._truth[round_] = truth

    def analyse(self) -> dict[str, float]:
        """Run the attack on the collected view and score it."""
        if 1 not in self._local:
            return {"identity_accuracy": float("nan"), "bucket_accuracy": float("nan"), "chance": float("nan"),
                    "fragments": 0, "senders": 0}
        neighbours = {s for r in self._truth.values() for s in r}
        reference = {s: v for s, v in self._round1.items() if s in neighbours}
        later = sorted(r for r in self._local if r >= 2)
        view = CuriousRecipientView(reference, self._local[1],
                                    tuple(RoundObservation(r, self._local[r], tuple(self._received[r])) for r in later))
        guesses = link_by_content(view)
        return score_content_linking(guesses, [self._truth[r] for r in later], len(reference))
