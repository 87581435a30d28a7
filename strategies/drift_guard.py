"""Re-check client drift every x rounds: a wrapper that drops flagged clients' updates.

Outermost in the composition (``DriftGuard(DP(cohort FedAvg))``): it sees the replies, every
``every`` rounds runs privacy.drift.detect_drift on the returned models, removes the flagged
clients' replies before the wrapped strategy clips / noises / aggregates, and tells the fixed
cohort (strategies.fixed_cohort) not to address them again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy

from privacy.drift import DriftReport, detect_drift, flatten
from strategies.fixed_cohort import FixedCohort
from strategies.records import array_record, to_numpy
from strategies.wrapper import StrategyWrapper

log = logging.getLogger(__name__)


class DriftGuard(StrategyWrapper):
    """Wrap ``strategy``; every ``every`` rounds flag and exclude drifted clients of ``cohort``."""

    def __init__(self, strategy: Strategy, cohort: FixedCohort, every: int, threshold: float,
                 min_ratio: float = 1.25) -> None:
        super().__init__(strategy)
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.cohort = cohort
        self.every = every
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.reports: dict[int, DriftReport] = {}

    def state(self) -> dict[str, Any]:
        """The layer's records and every drift report (exact values: a summary's rounded ones would drift)."""
        return {**super().state(), "reports": json.dumps({
            str(r): {"client_ids": list(rep.client_ids), "divergence": rep.divergence.tolist(),
                     "median_divergence": rep.median_divergence.tolist(), "z_scores": rep.z_scores.tolist(),
                     "threshold": rep.threshold, "min_ratio": rep.min_ratio, "flagged": list(rep.flagged)}
            for r, rep in self.reports.items()})}

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self.reports = {int(r): DriftReport(
            client_ids=tuple(d["client_ids"]), divergence=np.array(d["divergence"], dtype=np.float64),
            median_divergence=np.array(d["median_divergence"], dtype=np.float64),
            z_scores=np.array(d["z_scores"], dtype=np.float64), threshold=d["threshold"], min_ratio=d["min_ratio"],
            flagged=tuple(d["flagged"])) for r, d in json.loads(state["reports"]).items()}

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        if server_round % self.every == 0:
            checked = self.check(server_round, replies)
            ids = checked.contributors
            if len(ids) >= 3:
                rep = detect_drift(ids, [flatten(to_numpy(array_record(checked.reply_of[c].content["arrays"]))) for c in ids],
                                   self.threshold, self.min_ratio)
                self.reports[server_round] = rep
                if rep.flagged:
                    log.warning("round %d: drift re-check flags clients %s; excluded", server_round, rep.flagged)
                    self.cohort.exclude(rep.flagged)
                    dropped = {id(checked.reply_of[c]) for c in rep.flagged}
                    replies = [r for r in replies if id(r) not in dropped]
        return self.strategy.aggregate_train(server_round, replies)
