"""DP-SGD accounting: a ledger only *records* (sigma, q, steps) events; functions compute epsilon from it.

Epsilon comes from Google dp-accounting's RDP accountant on compositions of
``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``. :func:`paper_sqrt_t_bound` reproduces the
paper's basic-composition estimate for comparison only (it is not a valid DP-SGD bound under
subsampling). :func:`quiet_absl` keeps the accountant's absl warnings out of the logs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dp_accounting
from absl import logging as absl_logging


@contextmanager
def quiet_absl(level: int = logging.ERROR) -> Iterator[None]:
    """Drop absl log records below ``level`` (std ``logging`` levels) for the duration; restore everything after.

    Why: dp-accounting's RDP accountant (``dp_accounting/rdp/rdp_privacy_accountant.py``,
    ``_compute_log_a_frac``) logs one absl warning for every fractional RDP order (alpha in 1.1..10.9)
    whose series does not converge in 1000 terms -- common at sample rates q >= ~0.25 -- and then
    leaves that order out of the minimum, which is correct; a calibration evaluates epsilon dozens of
    times, hence hundreds of identical warnings. The threshold raised is the absl logger's level
    (what ``absl.logging.set_verbosity`` sets; it is not used because it cannot restore the NOTSET
    level a fresh absl logger has). ``absl.logging.log`` also calls ``logging.basicConfig()`` when the
    root logger has no handler, leaving a stderr handler behind for good; a ``NullHandler`` holds the
    root's place meanwhile (as :mod:`privacy.opacus_import` does for Opacus). Logging is process-wide:
    another thread's absl records in the same window are dropped too.
    """
    absl_logger = absl_logging.get_absl_logger()
    old_level = absl_logger.level
    root = logging.getLogger()
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:
        root.addHandler(guard)
    if absl_logger.getEffectiveLevel() < level:
        absl_logger.setLevel(level)
    try:
        yield
    finally:
        absl_logger.setLevel(old_level)
        if guard is not None:
            root.removeHandler(guard)


@dataclass(frozen=True)
class DpSgdEvent:
    """``steps`` Poisson-subsampled Gaussian steps with rate ``sample_rate`` and ``noise_multiplier``."""

    noise_multiplier: float
    sample_rate: float
    steps: int


class DpSgdLedger:
    """Records a client's DP-SGD events; :func:`rdp_epsilon` computes from it."""

    def __init__(self) -> None:
        self.events: list[DpSgdEvent] = []

    def record(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        """Append ``steps`` steps at (``noise_multiplier``, ``sample_rate``); zero steps record nothing.

        Raises
        ------
        ValueError
            If ``sample_rate`` is not in (0, 1] or ``steps`` is negative.
        """
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if steps:
            self.events.append(DpSgdEvent(float(noise_multiplier), float(sample_rate), int(steps)))

    @property
    def total_steps(self) -> int:
        return sum(e.steps for e in self.events)


def dp_event(events: list[DpSgdEvent]) -> dp_accounting.DpEvent:
    """The composed DpEvent of a ledger (events with the same (sigma, q) merged: composition is additive)."""
    steps: dict[tuple[float, float], int] = {}
    for e in events:
        steps[(e.noise_multiplier, e.sample_rate)] = steps.get((e.noise_multiplier, e.sample_rate), 0) + e.steps
    return dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), t)
        for (z, q), t in steps.items()])


def rdp_epsilon(events: list[DpSgdEvent], delta: float) -> float:
    """Epsilon at ``delta`` from dp-accounting's RDP accountant.

    Parameters
    ----------
    events : list of DpSgdEvent
        A ledger's events (empty: epsilon 0).
    delta : float
        In (0, 1).

    Returns
    -------
    float
        Epsilon; inf if any step had no noise.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not events:
        return 0.0
    if any(e.noise_multiplier == 0 for e in events):
        return math.inf
    with quiet_absl():
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_event(events))
        return float(acc.get_epsilon(delta))


def paper_sqrt_t_bound(noise_multiplier: float, steps: int, delta: float) -> float:
    """The paper's basic-composition estimate: eps_step * sqrt(T) with the classic Gaussian-mechanism
    eps_step = sqrt(2 ln(1.25 / delta)) / sigma, T = number of DP-SGD steps.

    Reported beside the accountant's value for comparison with the paper only: it ignores
    subsampling amplification and is not an (eps, delta) guarantee for T > 1.
    """
    if noise_multiplier <= 0:
        return math.inf
    return math.sqrt(steps) * math.sqrt(2 * math.log(1.25 / delta)) / noise_multiplier
