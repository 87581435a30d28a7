"""A strategy that wraps another (Flower's DP wrappers compose this way) and checks replies against the plan."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.cohorts import PlanChecked

if TYPE_CHECKING:
    from strategies.canaries import WeightedCanaries

log = logging.getLogger(__name__)


class StrategyWrapper(PlanChecked, Strategy):
    """Delegate everything to ``strategy``; remember the round's train messages for :meth:`check`.

    A subclass overrides ``aggregate_train`` only: it starts with ``self.check(...)``, changes
    the valid replies (clip, noise, exclude) and delegates aggregation.
    """

    array_claims = "none"  # wrapped Flower strategies: one model per reply

    def __init__(self, strategy: Strategy) -> None:
        super().__init__()
        self.strategy = strategy

    def summary(self) -> None:
        log.info("%s wrapping:", type(self).__name__)
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.current_arrays = arrays
        return self.remember(self.strategy.configure_train(server_round, arrays, config, grid))

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)


class ClippingWrapper(StrategyWrapper):
    """A server-side DP wrapper: clip updates to ``clipping_norm``, noise with multiplier ``noise_multiplier``.

    Holds the validated parameters, the noise generator (privacy.randomness) and ``rounds``,
    the per-round record (cohort size m, rejections, update norms, sigma) each subclass fills.
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float,
                 rng: np.random.Generator, canaries: "WeightedCanaries | None" = None) -> None:
        super().__init__(strategy)
        if not noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if not clipping_norm > 0:
            raise ValueError(f"clipping_norm must be > 0, got {clipping_norm}")
        self.noise_multiplier = noise_multiplier
        self.clipping_norm = clipping_norm
        self.rng = rng
        # Audit canaries (strategies.canaries): extra cohort members, inserted before the noise.
        if canaries is not None and canaries.canaries.clip_norm > clipping_norm * (1 + 1e-9):
            raise ValueError(f"canaries at norm {canaries.canaries.clip_norm:g} exceed the clip norm {clipping_norm:g}")
        self.canaries = canaries
        self.current_arrays = ArrayRecord()
        self.rounds: dict[int, dict] = {}
