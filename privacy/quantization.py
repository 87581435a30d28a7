"""Unbiased 8-bit stochastic quantization of a value slice (UnlinkableDFL fragment encoding).

A slice ``x`` is mapped to ``lo + scale * q`` with ``q in {0..255}``, ``lo = min(x)``,
``scale = (max(x) - min(x)) / 255``. Each value rounds up with probability equal to
its fractional position between the two neighbouring levels (stochastic rounding,
as in QSGD, Alistarh et al. 2017), so ``E[dequantize(quantize(x))] = x`` exactly
and the error of each value is at most ``scale``, with variance ``<= scale^2 / 4``.
"""

from __future__ import annotations

import numpy as np

LEVELS = 255  # q in {0, ..., 255}: one byte per value


def stochastic_quantize_uint8(
    x: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, float, float]:
    """Quantize ``x`` to bytes with unbiased stochastic rounding.

    Parameters
    ----------
    x
        1-D float array of finite values.
    rng
        Source of the rounding coins.

    Returns
    -------
    (q, lo, scale)
        ``q`` (uint8, same length), the offset and the step; the decoded value is
        ``lo + scale * q`` (see :func:`dequantize_uint8`). A constant slice has ``scale = 0``.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"x must be 1-D, got shape {x.shape}")
    if x.size == 0:
        return np.zeros(0, dtype=np.uint8), 0.0, 0.0
    if not np.isfinite(x).all():
        raise ValueError("x must contain only finite values")
    # lo and scale travel as float32: round them first so the decoder uses the same numbers.
    # lo is rounded down and scale up, so that [lo, lo + 255 scale] still covers every value.
    lo32 = np.float32(x.min())
    if float(lo32) > x.min():
        lo32 = np.nextafter(lo32, np.float32(-np.inf))
    lo = float(lo32)
    hi = float(x.max())
    scale32 = np.float32((hi - lo) / LEVELS)
    while lo + LEVELS * float(scale32) < hi:
        scale32 = np.nextafter(scale32, np.float32(np.inf))
    scale = float(scale32)
    if scale == 0.0:
        return np.zeros(x.size, dtype=np.uint8), lo, 0.0
    pos = np.clip((x - lo) / scale, 0.0, LEVELS)
    floor = np.floor(pos)
    up = rng.random(x.size) < (pos - floor)
    q = np.minimum(floor + up, LEVELS).astype(np.uint8)
    return q, lo, scale


def dequantize_uint8(q: np.ndarray, lo: float, scale: float) -> np.ndarray:
    """``lo + scale * q`` as float32 (the inverse map of :func:`stochastic_quantize_uint8`)."""
    q = np.asarray(q)
    if q.dtype != np.uint8:
        raise ValueError(f"q must be uint8, got {q.dtype}")
    if not (np.isfinite(lo) and np.isfinite(scale) and scale >= 0):
        raise ValueError(f"lo must be finite and scale finite and >= 0, got lo={lo}, scale={scale}")
    return (np.float64(lo) + np.float64(scale) * q.astype(np.float64)).astype(np.float32)
