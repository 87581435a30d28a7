"""Statistics over seeds, as the papers report them: mean +- sample SD and 95% Student-t CI."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class SeedSummary:
    """Summary of one metric over seeds (``None`` values = seeds that did not reach a criterion)."""

    n_total: int
    n: int
    mean: float
    sd: float
    ci_low: float
    ci_high: float

    def fmt(self, digits: int = 2) -> str:
        """'mean +- sd [lo, hi]' or 'Not reached (x/n)' when not every seed has a value."""
        if self.n < self.n_total:
            if self.n == 0:
                return f"Not reached (0/{self.n_total})"
            spread = "" if self.n == 1 else f" +- {self.sd:.{digits}f}"  # one value has no sample SD
            return f"{self.mean:.{digits}f}{spread} (reached {self.n}/{self.n_total})"
        if self.n == 1:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} +- {self.sd:.{digits}f} [{self.ci_low:.{digits}f}, {self.ci_high:.{digits}f}]"


def summarize(values: Sequence[float | None], confidence: float = 0.95) -> SeedSummary:
    """Mean, sample SD (ddof=1) and the Student-t interval with df = n - 1."""
    present = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))],
                         dtype=float)
    n = len(present)
    if n == 0:
        return SeedSummary(len(values), 0, math.nan, math.nan, math.nan, math.nan)
    mean = float(present.mean())
    if n == 1:
        return SeedSummary(len(values), 1, mean, math.nan, math.nan, math.nan)
    sd = float(present.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1)) * sd / math.sqrt(n)
    return SeedSummary(len(values), n, mean, sd, mean - half, mean + half)
