"""Name -> strategy builder for the dfl-dp frameworks (refuses duplicate names)."""

from __future__ import annotations

from collections.abc import Callable

from privacy.audit.canaries import CanarySet
from privacy.randomness import NoiseSource
from strategies.base import PatternStrategy
from strategies.canaries import CanaryInsertion
from strategies.fedavg_equal import EqualWeightFedAvg
from strategies.matched_perturbation import MatchedPerturbation
from strategies.sequential import SequentialDFL

Builder = Callable[..., PatternStrategy]
FRAMEWORKS: dict[str, tuple[Builder, str]] = {}
# Where an audit canary enters each framework's round (strategies.canaries.PLACEMENTS).
CANARY_PLACEMENT = {"client": "cohort-mean", "aggregate": "chain-end"}


def register_framework(name: str, builder: Builder, clip_at: str) -> None:
    """Register a learning framework: how to build it and where its DP variant clips."""
    if name in FRAMEWORKS:
        raise ValueError(f"framework {name!r} is already registered")
    FRAMEWORKS[name] = (builder, clip_at)


register_framework("fl", EqualWeightFedAvg, "client")
register_framework("sequential-dfl", SequentialDFL, "aggregate")


def build_strategy(
    framework: str,
    client_ids: list[int],
    action: str,
    clients_per_message: int = 1,
    dp: bool = False,
    clip_norm: float | None = None,
    eps_cal: float | None = None,
    delta_cal: float = 1e-5,
    noise: NoiseSource | None = None,
    stream: tuple[int, ...] = (),
    canaries: CanarySet | None = None,
    fault: str = "",
) -> PatternStrategy:
    """Build a framework's strategy, wrapped in matched perturbation when ``dp``.

    ``noise`` is where the DP noise comes from (default: secure, OS entropy); ``stream`` labels
    (e.g. the run seed) are mixed into a seeded source so that different runs differ.
    ``canaries`` (an audit, dp only): the inserted ones join every round's cohort before the noise.
    ``fault`` (issue 37, tests only): a broken matched perturbation (strategies.matched_perturbation).
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; allowed: {sorted(FRAMEWORKS)}")
    builder, clip_at = FRAMEWORKS[framework]
    inner = builder(client_ids, action, clients_per_message)
    if canaries is not None and not dp:
        raise ValueError("canaries audit a DP mechanism: they need dp=True")
    if fault and not dp:
        raise ValueError(f"fault {fault!r} breaks a DP mechanism: it needs dp=True")
    if not dp:
        return inner
    if clip_norm is None or eps_cal is None:
        raise ValueError("dp=True needs clip_norm and eps_cal")
    if canaries is not None:
        if canaries.clip_norm > clip_norm:
            raise ValueError(f"canaries at norm {canaries.clip_norm:g} exceed the clip norm {clip_norm:g}")
        inner = CanaryInsertion(inner, canaries, CANARY_PLACEMENT[clip_at])
    return MatchedPerturbation(inner, clip_norm, eps_cal, delta_cal, clip_at, noise, stream, fault)
