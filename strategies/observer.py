"""Watch a round without changing it: a wrapper that shows replies and results to callbacks.

Composed like the DP wrappers (``RoundObserver(MatchedPerturbation(FedAvg))``) instead of
replacing a live strategy's methods: a study that needs to capture what a round received
(e.g. dfl-dp's victim gradients for the inversion attacks) or the round's aggregated metrics
passes callbacks. Replies are checked first (strategies.cohorts.check_replies, with the rules of
the strategy it wraps): the callbacks and the wrapped strategy see the valid replies and, as error
replies, everything refused, so a hostile reply reaches neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from strategies.base import PatternStrategy
from strategies.cohorts import PlanChecked

RepliesHook = Callable[[int, list[Message]], None]
ResultHook = Callable[[int, ArrayRecord | None, MetricRecord | None], None]


class RoundObserver(PlanChecked, PatternStrategy):
    """Delegate everything to ``strategy``; call ``on_replies`` before and ``on_result`` after aggregation."""

    def __init__(self, strategy: PatternStrategy, on_replies: RepliesHook | None = None,
                 on_result: ResultHook | None = None) -> None:
        self.strategy = strategy
        self.on_replies = on_replies
        self.on_result = on_result
        self.array_claims = getattr(strategy, "array_claims", "each")
        self.member_weights = getattr(strategy, "member_weights", "equal")

    def summary(self) -> None:
        self.strategy.summary()

    def prepare_grid(self, grid: Grid) -> Grid:
        return self.strategy.prepare_grid(grid)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self.remember(self.strategy.configure_train(server_round, arrays, config, grid))

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = self.check(server_round, replies).replies
        if self.on_replies is not None:
            self.on_replies(server_round, replies)
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if self.on_result is not None:
            self.on_result(server_round, arrays, metrics)
        return arrays, metrics
