"""DP-SGD calibration: the Poisson sample rate of a loader, and the noise multiplier for a target epsilon.

The noise multiplier is found by dp-accounting's ``calibrate_dp_mechanism`` (bracketing, then Brent's
method, with a final check that the returned sigma does not exceed the budget) on the same DpEvent
the ledger composes (:func:`privacy.dpsgd.ledger.dp_event`): ``steps`` self-compositions of
``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``. So a calibrated sigma, trained with and
recorded in a :class:`~privacy.dpsgd.ledger.DpSgdLedger`, reports the epsilon it was calibrated to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import dp_accounting

from privacy.dpsgd.ledger import DpSgdEvent, dp_event, quiet_absl

# accountant name -> a fresh accountant (dp-accounting refuses events it cannot account for)
ACCOUNTANTS: dict[str, Callable[[], dp_accounting.PrivacyAccountant]] = {
    "rdp": dp_accounting.rdp.RdpAccountant,
}

# sigma tolerance of the search (dp-accounting's default): the achieved epsilon is within ~1e-6 relative
SIGMA_TOL = 1e-6


@dataclass(frozen=True)
class NoiseCalibration:
    """A calibrated noise multiplier and the epsilon it achieves (<= ``target_epsilon``) at ``delta``."""

    noise_multiplier: float
    epsilon: float
    target_epsilon: float
    delta: float
    sample_rate: float
    steps: int
    accountant: str


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def sample_rate(batch_size: int, num_samples: int) -> float:
    """The Poisson sample rate q of DP-SGD with expected batch ``batch_size`` over ``num_samples`` examples.

    Opacus' convention, which :func:`privacy.dpsgd.engine.make_private` (and so
    :func:`privacy.dpsgd.loop.train_dp_sgd`) trains with: q = 1 / ceil(n / B), one epoch being
    1 / q steps. It equals B / n when B divides n and is slightly larger otherwise.

    Parameters
    ----------
    batch_size : int
        Expected batch size B, 1 <= B <= n.
    num_samples : int
        The dataset size n >= 1.

    Returns
    -------
    float
        q in (0, 1].
    """
    _check_count("batch_size", batch_size)
    _check_count("num_samples", num_samples)
    if batch_size > num_samples:
        raise ValueError(f"batch_size must be <= num_samples, got batch_size={batch_size} > num_samples={num_samples}")
    return 1.0 / math.ceil(num_samples / batch_size)


def _epsilon(accountant: str, noise_multiplier: float, rate: float, steps: int, delta: float) -> float:
    acc = ACCOUNTANTS[accountant]()
    acc.compose(dp_event([DpSgdEvent(noise_multiplier, rate, steps)]))
    return float(acc.get_epsilon(delta))


def noise_multiplier_for_epsilon(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                                 accountant: str = "rdp") -> NoiseCalibration:
    """The smallest noise multiplier sigma (to 1e-6) whose ``steps`` Poisson-subsampled Gaussian steps
    at rate ``sample_rate`` stay within (``target_epsilon``, ``delta``).

    Parameters
    ----------
    target_epsilon : float
        > 0 and finite.
    delta : float
        In (0, 1).
    sample_rate : float
        Poisson rate q in (0, 1] (:func:`sample_rate`).
    steps : int
        Number of DP-SGD steps T >= 1 (every step counts, empty batches included).
    accountant : str
        A key of :data:`ACCOUNTANTS` ("rdp": the ledger's :func:`~privacy.dpsgd.ledger.rdp_epsilon`).

    Returns
    -------
    NoiseCalibration
        ``epsilon`` <= ``target_epsilon``; typically within 1e-6 relative below it, lower only where the
        accountant's epsilon jumps (RDP's conversion reports 0 once every order's divergence is below ~delta^2).

    Raises
    ------
    ValueError
        On bad input, or when no noise multiplier within dp-accounting's search range (2**30 times its
        initial guess of 1) reaches the target.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    _check_count("steps", steps)
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {sorted(ACCOUNTANTS)}, got {accountant!r}")
    rate = float(sample_rate)
    with quiet_absl():
        try:
            sigma = dp_accounting.calibrate_dp_mechanism(
                ACCOUNTANTS[accountant], lambda z: dp_event([DpSgdEvent(z, rate, steps)]),
                float(target_epsilon), float(delta), tol=SIGMA_TOL)
        except (dp_accounting.mechanism_calibration.NoBracketIntervalFoundError, ValueError) as err:
            raise ValueError(f"target epsilon {target_epsilon} at delta {delta} is unreachable with q={rate}, "
                             f"T={steps} ({accountant} accountant): {err}") from err
        eps = _epsilon(accountant, float(sigma), rate, steps, delta)
    if not (math.isfinite(sigma) and sigma > 0 and eps <= target_epsilon):
        raise ValueError(f"target epsilon {target_epsilon} at delta {delta} is unreachable with q={rate}, "
                         f"T={steps}: the search ended at sigma={sigma} with epsilon={eps}")
    return NoiseCalibration(float(sigma), eps, float(target_epsilon), float(delta), rate, int(steps), accountant)
