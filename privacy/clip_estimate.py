"""A clip-norm estimate that no single reply (nor ``tolerate`` of them) controls.

The tabular study sets its clip norm C the way its seed paper does (Sec. VI): a quantile of the
clients' update norms after one round without DP. The plain empirical quantile lets one client
choose C: among nine honest norms near 1, one reply of 1e6 moves NumPy's interpolated 0.9-quantile
to about 1e5, and an infinite norm makes C (and every sigma sized by it) infinite.

:func:`robust_quantile` is the order statistic the quantile asks for (no interpolation), with its
rank kept ``tolerate`` places away from both ends. With at most ``tolerate`` hostile values among
n >= 2 * tolerate + 1, the result is then always one of the values or lies between two honest
ones: it is at least the honest values' ``rank - tolerate``-th order statistic and at most their
``rank``-th, whatever the hostile values are (they can shift the rank by at most ``tolerate``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def robust_quantile(values: Sequence[float], q: float, tolerate: int = 1) -> float:
    """The ``q``-quantile of ``values`` as an order statistic, its rank kept in [tolerate, n - 1 - tolerate].

    Parameters
    ----------
    values : the per-client statistics (e.g. update norms); every one finite and >= 0.
    q : the quantile, in (0, 1].
    tolerate : how many of ``values`` may be hostile; needs n >= 2 * tolerate + 1.
    """
    x = np.asarray(list(values), dtype=np.float64)
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q}")
    if tolerate < 0:
        raise ValueError(f"tolerate must be >= 0, got {tolerate}")
    if x.ndim != 1 or x.size < 2 * tolerate + 1:
        raise ValueError(f"a quantile robust to {tolerate} hostile value(s) needs at least {2 * tolerate + 1} "
                         f"values, got {x.size}")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"values must be finite and >= 0, got {x.tolist()}")
    x.sort()
    rank = max(0, math.ceil(q * x.size) - 1)  # inverted CDF: the smallest value with F(value) >= q
    rank = min(max(rank, tolerate), x.size - 1 - tolerate)
    return float(x[rank])


def check_clip_norm(clip_norm: float, source: str) -> float:
    """``clip_norm`` if it is finite and > 0, else a ValueError naming where it came from."""
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip norm from {source} is {clip_norm}: it must be finite and > 0 "
                         f"(noise is sized by it; an infinite C means infinite noise, a zero C no signal)")
    return float(clip_norm)
