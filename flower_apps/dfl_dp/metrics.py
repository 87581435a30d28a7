"""Curve metrics of the seed paper (Sec. 3.5), as pure functions of an accuracy curve.

Rounds are 1-based: ``acc[0]`` is the accuracy after round 1.
"""

from __future__ import annotations

from collections.abc import Sequence


def rounds_to_threshold(acc: Sequence[float], threshold: float = 0.75) -> int | None:
    """First round with accuracy >= threshold, or None if never reached."""
    for i, a in enumerate(acc):
        if a >= threshold:
            return i + 1
    return None


def stability_round(acc: Sequence[float], window: int = 5, tolerance: float = 0.005) -> int | None:
    """First round r such that rounds r..r+window-1 have max - min <= tolerance, or None."""
    for i in range(0, len(acc) - window + 1):
        w = acc[i : i + window]
        if max(w) - min(w) <= tolerance + 1e-12:  # float slack: 0.905 - 0.900 must count as 0.005
            return i + 1
    return None


def retention_and_degradation(final_acc: float, nodp_final_acc: float) -> tuple[float, float]:
    """(utility retention in %, accuracy degradation in percentage points) vs the same seed's No-DP run."""
    if nodp_final_acc <= 0:
        raise ValueError(f"No-DP accuracy must be > 0, got {nodp_final_acc}")
    return 100.0 * final_acc / nodp_final_acc, 100.0 * (nodp_final_acc - final_acc)


def curve_summary(acc: Sequence[float]) -> dict[str, float | int | None]:
    """Final and best accuracy, rounds-to-75%, stability round."""
    if not acc:
        raise ValueError("empty accuracy curve")
    return {
        "final_acc": float(acc[-1]),
        "best_acc": float(max(acc)),
        "rounds_to_75": rounds_to_threshold(acc, 0.75),
        "stability_round": stability_round(acc),
    }
