"""Mean, sample SD and 95 % Student-t interval over seeds.

Tables in the papers state ``mean +- sample SD`` and the 95 % Student-t interval
over independent seeds. This module is deliberately tiny and free of attack
specifics so that it can move to a shared place later.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class SeedSummary:
    """Summary of one quantity over seeds.

    Attributes
    ----------
    mean : float
        Arithmetic mean over seeds.
    sd : float
        Sample standard deviation (``ddof=1``); NaN when ``n == 1``.
    ci95_low, ci95_high : float
        Two-sided 95 % Student-t interval for the mean (``n - 1`` degrees of
        freedom); NaN when ``n == 1``.
    n : int
        Number of seeds.
    """

    mean: float
    sd: float
    ci95_low: float
    ci95_high: float
    n: int

    def as_dict(self, prefix: str = "") -> dict[str, float | int]:
        """The fields as a flat dict, keys optionally prefixed (``"ssim_mean"``)."""
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def summarize_over_seeds(values: Iterable[float], confidence: float = 0.95) -> SeedSummary:
    """Mean, sample SD and Student-t confidence interval of per-seed values.

    Parameters
    ----------
    values : iterable of float
        One finite value per seed (already averaged within the seed).
    confidence : float, default 0.95
        Coverage of the two-sided interval, in (0, 1).

    Returns
    -------
    SeedSummary
        With ``sd`` and the interval NaN (and a warning) for a single seed.

    Raises
    ------
    ValueError
        If ``values`` is empty or not finite, or ``confidence`` is outside (0, 1).
    """
    x = np.asarray(list(values), dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"values must be finite, got {x.tolist()}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = int(x.size)
    mean = float(x.mean())
    if n == 1:
        warnings.warn("one seed: sample SD and confidence interval are undefined (NaN)", stacklevel=2)
        return SeedSummary(mean, math.nan, math.nan, math.nan, 1)
    sd = float(x.std(ddof=1))
    # Half-width t_{(1+c)/2, n-1} * sd / sqrt(n).
    half = float(stats.t.ppf(0.5 + confidence / 2.0, df=n - 1)) * sd / math.sqrt(n)
    return SeedSummary(mean, sd, mean - half, mean + half, n)
