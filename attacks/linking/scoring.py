"""Ground truth for sender linking: which frames deliver fragment packets, who sent them, and scores.

Only this module reads :class:`~mixnet.trace.GroundTruth`; attacks never do.
A fragment packet leaves its sender as a ``real`` (or ``retransmission``) frame; each
relay's ``relay`` frame points back (``in_ref``) to the frame it came in as. Following
these links from the sender's frame gives the packet's path; its last frame is the
delivery to the receiver (the attack's target) when it arrived there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from attacks.linking.timing import LinkingGuess
from mixnet.trace import AdversaryView, GroundTruth

DATA_KINDS = ("real", "retransmission")


@dataclass(frozen=True)
class FragmentTarget:
    frame: int  # the delivering frame (index into view.records)
    sender: int
    receiver: int


def fragment_targets(view: AdversaryView, truth: GroundTruth, pairs: Iterable[tuple[int, int]] | None = None,
                     kinds: Sequence[str] = DATA_KINDS) -> list[FragmentTarget]:
    """Delivering frames of every fragment packet, with the true sender.

    ``pairs``: the (sender, receiver) pairs that were really used (from the message
    records); a path whose last frame ends elsewhere (dropped at a relay) is skipped.
    """
    if len(view.records) != len(truth.records):
        raise ValueError("view and truth must describe the same trace")
    child: dict[int, int] = {}
    for j, t in enumerate(truth.records):
        if t.kind == "relay" and t.in_ref is not None:
            child[t.in_ref] = j
    allowed = set(pairs) if pairs is not None else None
    out = []
    for i, t in enumerate(truth.records):
        if t.kind not in kinds:
            continue
        j = i
        while j in child:
            j = child[j]
        last = view.records[j]
        sender = view.records[i].src
        if last.arrival is None or (allowed is not None and (sender, last.dst) not in allowed):
            continue
        out.append(FragmentTarget(j, sender, last.dst))
    return out


@dataclass(frozen=True)
class LinkingScore:
    accuracy: float
    baseline: float  # mean of 1 / |U_T|
    advantage: float  # accuracy - baseline
    mean_anonymity: float  # mean |U_T|
    mean_candidates: float  # mean |C_T| (trace-consistent)
    exposed: float  # fraction of targets with |C_T| = 1
    sender_in_candidates: float  # fraction of targets whose true sender is in C_T
    targets: int

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def score_linking(guesses: Sequence[LinkingGuess], targets: Sequence[FragmentTarget]) -> LinkingScore:
    """Identification accuracy against the truth, the random baseline and the advantage."""
    truth = {t.frame: t.sender for t in targets}
    if not guesses:
        nan = float("nan")
        return LinkingScore(nan, nan, nan, nan, nan, nan, nan, 0)
    hits = [g.guess == truth[g.target] for g in guesses]
    base = [1.0 / len(g.anonymity) if g.anonymity else 0.0 for g in guesses]
    acc, b = float(np.mean(hits)), float(np.mean(base))
    return LinkingScore(acc, b, acc - b, float(np.mean([len(g.anonymity) for g in guesses])),
                        float(np.mean([len(g.candidates) for g in guesses])),
                        float(np.mean([len(g.candidates) == 1 for g in guesses])),
                        float(np.mean([truth[g.target] in g.candidates for g in guesses])), len(guesses))
