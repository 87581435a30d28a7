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
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from privacy.faults import FAULTS_BY_STUDY, check_fault
from strategies.cohorts import PlanChecked
from strategies.layer import MemberClip, layer_of, layers, start_rounds

if TYPE_CHECKING:
    from strategies.canaries import WeightedCanaries

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


class ClippingWrapper(StrategyWrapper):
    """A server-side DP wrapper: clip updates to ``clipping_norm``, noise with multiplier ``noise_multiplier``.

    Holds the validated parameters, the noise generator (privacy.randomness) and ``rounds``,
    the per-round record (cohort size m, rejections, update norms, sigma) each subclass fills.

    Audit canaries (strategies.canaries.WeightedCanaries) are cohort members: their updates pass
    through the same clip and noise as the real clients' (issue 37: canaries above C test the clip).

    Broken variants (issue 37, ``fault``; privacy/faults.py, refused unless ``PPFL_ALLOW_DP_FAULTS=1``)
    change only what the mechanism *does*; what it reports (sigma, the clip counters) stays what the
    correct mechanism would report, as a real bug would. Each subclass's module doc says how.
    """

    #: the broken variants these wrappers can carry (tests and benchmarks only)
    FAULTS = FAULTS_BY_STUDY["tabular-pdp"]

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float,
                 rng: np.random.Generator, canaries: WeightedCanaries | None = None, fault: str = "") -> None:
        super().__init__(strategy)
        if not noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if not clipping_norm > 0:
            raise ValueError(f"clipping_norm must be > 0, got {clipping_norm}")
        if fault and fault not in self.FAULTS:
            raise ValueError(f"fault must be '' or one of {self.FAULTS}, got {fault!r}")
        check_fault(fault)  # refused unless PPFL_ALLOW_DP_FAULTS=1 (never a production default)
        self.noise_multiplier = noise_multiplier
        self.clipping_norm = clipping_norm
        self.rng = rng
        self.fault = fault
        self.canaries = canaries  # audit canaries (strategies.canaries): extra cohort members, before the noise
        self.current_arrays = ArrayRecord()
        self.rounds: dict[int, dict] = {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.current_arrays = arrays  # w(t): each member's update is its model minus this
        return super().configure_train(server_round, arrays, config, grid)

    @property
    def clips_before_noise(self) -> bool:
        """False under the skip-clip and clip-after-noise bugs: members' updates enter unclipped."""
        return self.fault not in ("skip-clip", "clip-after-noise")
