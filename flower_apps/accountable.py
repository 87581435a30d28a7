"""Refuse, at config time, DP settings the study's own accountant cannot account for.

Each DP study reports epsilon from an accountant after training (dfl-dp: ``privacy.accounting.account``;
tabular-pdp: ``privacy.tabular_accounting``; ultrasound: ``privacy.dpsgd.rdp_epsilon``). A key's
static range (``eps-cal > 0``) does not say which values that accountant can compute: ``eps-cal=1e300``
gives a noise multiplier of 1e-300, and the accountant divides by zero after the model is written.
So ``build_config`` calls the same accountant once, up front (milliseconds), through
:func:`refuse_unaccountable`; only when it fails does this module search each key's working range
(bisection with the other keys fixed, tens of accountant calls) to say what is allowed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from flower_apps.config import ConfigError, Key

# What an accountant or a calibration raises on values outside its numerical range.
NUMERIC_ERRORS = (ValueError, ArithmeticError)
_FLOAT_MAX = float(np.finfo(np.float64).max)
_INT_MAX = 2**63 - 1  # Flower's run config carries int64


def noise_sd_error(name: str, sigma: float) -> str | None:
    """Why the noise SD ``sigma`` is degenerate in the models' float32 parameters, else None."""
    with np.errstate(over="ignore", under="ignore"):
        as_f32 = float(np.float32(sigma))
    if not math.isfinite(as_f32):
        return f"{name} = {sigma:.3g} is not finite in float32 parameters"
    if as_f32 == 0.0:
        return f"{name} = {sigma:.3g} underflows to 0 in float32 parameters (no noise)"
    return None


def _failure(epsilon: Callable[[dict[str, Any]], float], values: dict[str, Any]) -> str | None:
    """Why ``epsilon(values)`` cannot be used (it raised, or is not finite), else None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eps = epsilon(values)
    except NUMERIC_ERRORS as exc:  # OverflowError's text alone is "(34, 'Numerical result out of range')"
        return str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
    if not (isinstance(eps, (int, float)) and math.isfinite(eps)):
        return f"epsilon = {eps!r} is not finite"
    return None


def _extremes(key: Key) -> tuple[float, float]:
    """The smallest and largest value the key's static range allows."""
    if key.type is int:
        lo = key.ge if key.ge is not None else (key.gt + 1 if key.gt is not None else -_INT_MAX)
        hi = key.le if key.le is not None else (key.lt - 1 if key.lt is not None else _INT_MAX)
        return int(lo), int(hi)
    lo = key.ge if key.ge is not None else (math.nextafter(key.gt, math.inf) if key.gt is not None else -_FLOAT_MAX)
    hi = key.le if key.le is not None else (math.nextafter(key.lt, -math.inf) if key.lt is not None else _FLOAT_MAX)
    return float(lo), float(hi)


def _boundary(ok: Callable[[Any], bool], good: Any, bad: Any, is_int: bool) -> Any:
    """The last good value between ``good`` and ``bad`` (geometric bisection: the ranges span decades)."""
    for _ in range(200):
        if is_int:
            if abs(bad - good) <= 1 or (good > 0 and bad > 0 and max(good, bad) / min(good, bad) < 1.001):
                return good
            mid = math.isqrt(good * bad) if good > 0 and bad > 0 else (good + bad) // 2
            mid = min(max(mid, min(good, bad) + 1), max(good, bad) - 1)
        else:
            if good > 0 and bad > 0:
                if max(good, bad) / min(good, bad) < 1.001:
                    return good
                mid = math.sqrt(good) * math.sqrt(bad)
            else:
                if abs(bad - good) < 1e-3 * max(abs(good), abs(bad), 1e-300):
                    return good
                mid = (good + bad) / 2
        good, bad = (mid, bad) if ok(mid) else (good, mid)
    return good


def _shown(x: Any, inward_up: bool) -> str:
    """``x`` to 3 significant digits, rounded toward the inside of the range (never a value that fails)."""
    if isinstance(x, int) or x == 0 or not math.isfinite(x):
        return str(x)
    shown = float(f"{x:.3g}")
    if (shown < x) if inward_up else (shown > x):
        step = 10.0 ** (math.floor(math.log10(abs(x))) - 2)
        shown += step if inward_up else -step
    return f"{shown:.3g}"


def working_range(key: Key, values: dict[str, Any], epsilon: Callable[[dict[str, Any]], float]) -> str:
    """The values of ``key`` the accountant can use with the other keys as given, in words."""
    def ok(v: Any) -> bool:
        return _failure(epsilon, {**values, key.name: v}) is None

    start = key.default
    if not ok(start):
        start = values[key.name] if ok(values[key.name]) else None
    if start is None:
        return f"no {key.name} works with the other keys as given"
    lo_ext, hi_ext = _extremes(key)
    is_int = key.type is int
    lo = lo_ext if ok(lo_ext) else _boundary(ok, start, lo_ext, is_int)
    hi = hi_ext if ok(hi_ext) else _boundary(ok, start, hi_ext, is_int)
    return f"{key.name} in [{_shown(lo, True)}, {_shown(hi, False)}]"


def refuse_unaccountable(keys: Mapping[str, Key], values: dict[str, Any],
                         epsilon: Callable[[dict[str, Any]], float], what: str) -> None:
    """Raise ConfigError unless ``epsilon(values)`` is a finite number.

    Parameters
    ----------
    keys : the declarations of the keys the accountant reads (their ranges bound the search).
    values : key name -> value, exactly the keys ``epsilon`` reads.
    epsilon : the study's accountant on these values; raises ValueError / ArithmeticError for a
        setting it cannot account for (a degenerate noise SD included: :func:`noise_sd_error`).
    what : the accountant, in words (the message names it).
    """
    why = _failure(epsilon, values)
    if why is None:
        return
    # The keys whose own value lies outside their range are the culprits; else it is the combination.
    culprits = [n for n in values if _failure(epsilon, {**values, n: keys[n].default}) is None] or list(values)
    given = ", ".join(f"{n}={values[n]!r}" for n in values)
    ranges = "; ".join(working_range(keys[n], values, epsilon) for n in culprits)
    raise ConfigError(f"{', '.join(culprits)}: {what} cannot account for {given} ({why}); "
                      f"allowed with the other keys as given: {ranges}")
