"""The server-side DP wrapper base: clip updates to C, add Gaussian noise (ServerSideFixedClipping,
PersonalizedServerSideClipping build on it).

Its own module, not strategies.wrapper: its audit canaries come from strategies.canaries, whose
CanaryInsertion is itself a StrategyWrapper (keeps the import graph one-way).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from privacy.faults import FAULTS_BY_STUDY, check_fault
from privacy.randomness import generator_state, set_generator_state
from strategies.canaries import WeightedCanaries
from strategies.wrapper import StrategyWrapper


def _plain(value: Any) -> Any:
    """JSON for the NumPy scalars and arrays a round's record may hold."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"a DP round record holds a {type(value).__name__}, which a round checkpoint cannot keep")


def _int_keys(value: Any) -> Any:
    """A record read back from JSON with its client-id keys (all digits) as ints again."""
    if isinstance(value, dict):
        return {(int(k) if k.lstrip("-").isdigit() else k): _int_keys(v) for k, v in value.items()}
    return value


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
                 rng: np.random.Generator, canaries: WeightedCanaries | None = None, fault: str = "",
                 keep_noise_state: bool = False) -> None:
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
        # A seeded noise source's generator state may go into a round checkpoint (the resumed run then draws
        # the noise the uninterrupted one would); a secure one's is a secret and never does.
        self.keep_noise_state = keep_noise_state

    def state(self) -> dict[str, Any]:
        """The layer's records and per-round DP record; the noise generator's state only if ``keep_noise_state``."""
        out = {**super().state(), "dp_rounds": json.dumps({str(r): info for r, info in self.rounds.items()},
                                                          default=_plain)}
        if self.keep_noise_state:
            out["noise_state"] = generator_state(self.rng)
        return out

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self.rounds = {int(r): _int_keys(info) for r, info in json.loads(state["dp_rounds"]).items()}
        if self.keep_noise_state:
            if "noise_state" not in state:
                raise ValueError("the checkpoint holds no noise-generator state for this seeded DP wrapper")
            set_generator_state(self.rng, state["noise_state"])

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.current_arrays = arrays  # w(t): each member's update is its model minus this
        return super().configure_train(server_round, arrays, config, grid)

    @property
    def clips_before_noise(self) -> bool:
        """False under the skip-clip and clip-after-noise bugs: members' updates enter unclipped."""
        return self.fault not in ("skip-clip", "clip-after-noise")
