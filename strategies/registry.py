"""Name -> learning framework over logical clients, for any study (refuses duplicate names).

A framework is a strategy builder ``(client_ids, action, clients_per_message)`` and where its DP
variant (matched perturbation, strategies.matched_perturbation) clips, or None when it has none.
"""

from __future__ import annotations

from collections.abc import Callable

from privacy.audit.canaries import CanarySet
from privacy.randomness import NoiseSource
from privacy.sampling import CohortSampler
from strategies.base import LogicalClientStrategy, PatternStrategy
from strategies.canaries import CanaryInsertion
from strategies.fedavg_equal import EqualWeightFedAvg
from strategies.fedavg_examples import ExampleWeightedFedAvg
from strategies.matched_perturbation import CLIP_LEVELS, MatchedPerturbation
from strategies.sequential import SequentialDFL

Builder = Callable[..., PatternStrategy]
FRAMEWORKS: dict[str, tuple[Builder, str | None]] = {}
# Where an audit canary enters each framework's round (strategies.canaries.PLACEMENTS).
CANARY_PLACEMENT = {"client": "cohort-mean", "aggregate": "chain-end"}


def register_framework(name: str, builder: Builder, clip_at: str | None) -> None:
    """Register a learning framework: how to build it and where its DP variant clips (None: no DP variant)."""
    if name in FRAMEWORKS:
        raise ValueError(f"framework {name!r} is already registered")
    if clip_at is not None and clip_at not in CLIP_LEVELS:
        raise ValueError(f"clip_at must be None or one of {CLIP_LEVELS}, got {clip_at!r}")
    FRAMEWORKS[name] = (builder, clip_at)


def supports_dp(framework: str) -> bool:
    """Whether ``framework`` has a DP variant (``build_strategy(..., dp=True)``)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; allowed: {sorted(FRAMEWORKS)}")
    return FRAMEWORKS[framework][1] is not None


# FedAvg with equal client weights: the seed paper's FL (Sec. 3.3), what the dfl-dp study calls "fl".
register_framework("fl", EqualWeightFedAvg, "client")
register_framework("sequential-dfl", SequentialDFL, "aggregate")
# FedAvg weighted by reported examples (McMahan et al. 2017). No DP variant: the matched perturbation's
# noise is sized for equal weights (strategies.fedavg_examples).
register_framework("fedavg-examples", ExampleWeightedFedAvg, None)


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
    placement: dict[int, int] | None = None,
    sampler: CohortSampler | None = None,
) -> PatternStrategy | MatchedPerturbation:
    """Build a framework's strategy, wrapped in matched perturbation when ``dp``.

    ``noise`` is where the DP noise comes from (default: secure, OS entropy); ``stream`` labels
    (e.g. the run seed) are mixed into a seeded source so that different runs differ.
    ``canaries`` (an audit, dp only): the inserted ones join every round's cohort before the noise.
    ``fault`` (issue 37, tests only): a broken matched perturbation (strategies.matched_perturbation).
    ``placement`` (node-local data): logical client -> the node holding it, where the messages go
    (strategies.cohorts.plan_cohorts); None in a simulation.
    ``sampler`` (client sampling, privacy.sampling): the server's secret per-round draw over ``client_ids``
    (and, in an audit, the inserted canaries as its extra members); only the drawn clients get messages,
    and the DP wrapper normalises and sizes its noise as the scheme says (strategies.matched_perturbation).
    None = full participation (the seed paper's setting).
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; allowed: {sorted(FRAMEWORKS)}")
    builder, clip_at = FRAMEWORKS[framework]
    if dp and clip_at is None:
        raise ValueError(f"framework {framework!r} has no DP variant (matched perturbation sizes its noise for "
                         f"equal-weight members); DP frameworks: {sorted(f for f in FRAMEWORKS if supports_dp(f))}")
    inner = builder(client_ids, action, clients_per_message)
    if placement is not None:
        if not isinstance(inner, LogicalClientStrategy):  # it would plan its messages without the placement
            raise ValueError(f"framework {framework!r} does not plan messages over logical clients: no placement")
        inner.placement = dict(placement)
    if sampler is not None:
        if not isinstance(inner, LogicalClientStrategy):  # it would plan every client every round
            raise ValueError(f"framework {framework!r} does not plan messages over logical clients: no sampling")
        if sampler.num_clients != len(client_ids):
            raise ValueError(f"the sampler draws from {sampler.num_clients} clients, got {len(client_ids)} client ids")
        k_in = 0 if canaries is None else int(canaries.inserted.sum())
        if sampler.num_extra != k_in:
            raise ValueError(f"the sampler draws {sampler.num_extra} extra members; the audit inserts {k_in} canaries")
        inner.sample_with(sampler)
    if canaries is not None and not dp:
        raise ValueError("canaries audit a DP mechanism: they need dp=True")
    if fault and not dp:
        raise ValueError(f"fault {fault!r} breaks a DP mechanism: it needs dp=True")
    if not dp:
        return inner
    assert clip_at is not None
    if clip_norm is None or eps_cal is None:
        raise ValueError("dp=True needs clip_norm and eps_cal")
    if canaries is not None:
        if canaries.clip_norm > clip_norm:
            raise ValueError(f"canaries at norm {canaries.clip_norm:g} exceed the clip norm {clip_norm:g}")
        return MatchedPerturbation(CanaryInsertion(inner, canaries, CANARY_PLACEMENT[clip_at], sampler), clip_norm,
                                   eps_cal, delta_cal, clip_at, noise, stream, fault, sampler)
    return MatchedPerturbation(inner, clip_norm, eps_cal, delta_cal, clip_at, noise, stream, fault, sampler)
