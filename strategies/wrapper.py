"""The one wrapper base: a strategy around another that delegates the whole protocol by default.

Flower's DP wrappers compose this way (``DifferentialPrivacyServerSideFixedClipping(strategy=FedAvg(...))``);
here every wrapper does: the DP mechanisms (``MatchedPerturbation``, ``ServerSideFixedClipping``,
``PersonalizedServerSideClipping``), the audit canaries (``CanaryInsertion``), the drift re-check
(``DriftGuard``), the observer (``RoundObserver``) and the resume offset (strategies.resume). A wrapper
overrides only what it changes (usually ``aggregate_train``); everything else reaches the wrapped strategy:
the four round hooks, ``summary``, ``start``, and the protocol of strategies.layer (``prepare_grid``,
``round_limits``, ``array_claims``, ``member_weights``, ``weight_key``, ``clip_members_with``), whether the
wrapped strategy is ours or one of Flower's. ``layers()`` walks the composition, outermost first; each layer
keeps its own ``problems`` and ``client_metrics`` (strategies.cohorts.PlanChecked) and checks replies against
its remembered messages with :meth:`check`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from strategies.cohorts import PlanChecked
from strategies.layer import MemberClip, layer_of, layers, start_rounds

log = logging.getLogger(__name__)


class StrategyWrapper(PlanChecked, Strategy):
    """Delegate everything to ``strategy``; remember the round's train messages for :meth:`check`.

    A subclass overrides what it changes: ``aggregate_train`` starts with ``self.check(...)`` when it reads
    the replies, changes the valid ones (clip, noise, exclude) and delegates aggregation.
    """

    def __init__(self, strategy: Strategy) -> None:
        super().__init__()
        self.strategy = strategy

    # --- the protocol (strategies.layer): the wrapped strategy's answers
    @property
    def array_claims(self) -> str:
        return layer_of(self.strategy).array_claims

    @property
    def member_weights(self) -> str:
        return layer_of(self.strategy).member_weights

    @property
    def weight_key(self) -> str:
        return layer_of(self.strategy).weight_key

    def prepare_grid(self, grid: Grid) -> Grid:
        return layer_of(self.strategy).prepare_grid(grid)

    def round_limits(self) -> AbstractContextManager[object]:
        return layer_of(self.strategy).round_limits()

    def clip_members_with(self, clip: MemberClip) -> None:
        layer_of(self.strategy).clip_members_with(clip)

    def layers(self) -> Iterator[object]:
        yield self
        yield from layers(self.strategy)

    # --- Flower's strategy hooks
    def summary(self) -> None:
        log.info("%s wrapping:", type(self).__name__)
        self.strategy.summary()

    def start(  # same contract as flwr's Strategy.start, over the composition's grid view
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        return start_rounds(self, grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config,
                            evaluate_fn)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self.remember(self.strategy.configure_train(server_round, arrays, config, grid))

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)
