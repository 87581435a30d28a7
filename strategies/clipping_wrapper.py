"""The server-side DP wrapper base: clip updates to C, add Gaussian noise (ServerSideFixedClipping,
PersonalizedServerSideClipping build on it).

Its own module, not strategies.wrapper: its audit canaries come from strategies.canaries, whose
CanaryInsertion is itself a StrategyWrapper (keeps the import graph one-way).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from privacy.faults import FAULTS_BY_STUDY, check_fault
from strategies.canaries import WeightedCanaries
from strategies.wrapper import StrategyWrapper


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
