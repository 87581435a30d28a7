"""Watch a round without changing it: a wrapper that shows replies and results to callbacks.

Composed like the DP wrappers (``RoundObserver(MatchedPerturbation(FedAvg))``) instead of
replacing a live strategy's methods: a study that needs to capture what a round received
(e.g. dfl-dp's victim gradients for the inversion attacks) or the round's aggregated metrics
passes callbacks. Replies are checked first (strategies.cohorts.check_replies, with the rules of
the strategy it wraps): the callbacks and the wrapped strategy see the valid replies and, as error
replies, everything refused, so a hostile reply reaches neither. A strategies.wrapper.StrategyWrapper:
everything else (the grid view, evaluation, ``summary``, the protocol) is the wrapped strategy's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy

from strategies.wrapper import StrategyWrapper

RepliesHook = Callable[[int, list[Message]], None]
ResultHook = Callable[[int, ArrayRecord | None, MetricRecord | None], None]


class RoundObserver(StrategyWrapper):
    """Delegate everything to ``strategy``; call ``on_replies`` before and ``on_result`` after aggregation."""

    unresumable = "its callbacks hold what they observed in this process only"

    def __init__(self, strategy: Strategy, on_replies: RepliesHook | None = None,
                 on_result: ResultHook | None = None) -> None:
        super().__init__(strategy)
        self.on_replies = on_replies
        self.on_result = on_result

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = self.check(server_round, replies).replies
        if self.on_replies is not None:
            self.on_replies(server_round, replies)
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if self.on_result is not None:
            self.on_result(server_round, arrays, metrics)
        return arrays, metrics
