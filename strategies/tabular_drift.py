"""Re-check client drift every x rounds: a wrapper that drops flagged clients' updates.

Outermost in the composition (``DriftGuard(DP(ClientFedAvg))``): it sees the raw replies,
every ``every`` rounds runs privacy.drift.detect_drift on the returned models, removes the
flagged clients' replies before the wrapped strategy clips / noises / aggregates, and tells
the base FedAvg not to address them again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from privacy.drift import DriftReport, detect_drift, flatten
from strategies.records import to_numpy
from strategies.tabular_fedavg import ClientFedAvg, reply_client_id

log = logging.getLogger(__name__)


class DriftGuard(Strategy):
    """Wrap ``strategy``; every ``every`` rounds flag and exclude drifted clients of ``base``."""

    def __init__(self, strategy: Strategy, base: ClientFedAvg, every: int, threshold: float,
                 min_ratio: float = 1.25) -> None:
        super().__init__()
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.strategy = strategy
        self.base = base
        self.every = every
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.reports: dict[int, DriftReport] = {}

    def summary(self) -> None:
        log.info("DriftGuard: re-check every %d rounds, threshold %.2f", self.every, self.threshold)
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        if server_round % self.every == 0:
            ok = [r for r in replies if not r.has_error()]
            if len(ok) >= 3:
                ids = [reply_client_id(r) for r in ok]
                rep = detect_drift(ids, [flatten(to_numpy(r.content["arrays"])) for r in ok], self.threshold,
                                   self.min_ratio)
                self.reports[server_round] = rep
                if rep.flagged:
                    log.warning("round %d: drift re-check flags clients %s; excluded", server_round, rep.flagged)
                    self.base.exclude(rep.flagged)
                    replies = [r for r in replies if r.has_error() or reply_client_id(r) not in rep.flagged]
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)
