"""Client sampling: which members of the population take part in a round (the server's secret draw).

Two schemes (McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models", DP-FedAvg):

``poisson``
    Each member independently with probability q. The cohort's size varies (it may be empty); DP-FedAvg
    divides the sum of clipped updates by the *fixed* expected cohort q N and calibrates the noise to that
    denominator, so the release's add/remove sensitivity is C / (q N) whatever the draw. Accounted as
    ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under add/remove adjacency (privacy.accounting).
``fixed``
    Exactly m = round(q N) (half up) members, uniformly without replacement. The cohort's size is public;
    accounted as ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z))`` under replace-one
    adjacency (the seed paper's relation, sensitivity 2C/m of the mean over the m sampled clients).

Whom the amplification protects against. Amplification by sampling holds against an adversary who sees
the released models but not *which* clients were sampled: the other clients and any observer of the
releases. It does not hold against the server (which draws the cohort and is trusted to add the noise),
nor against a party that learns the cohort some other way (a client knows only that it was itself asked;
the amplification is a statement about the others). The draw must therefore be secret: it comes from the
server's own DP randomness (privacy.randomness.NoiseSource with :data:`STREAM_CLIENT_SAMPLING`: OS entropy
by default, the server's local seed file on request), never from the run seed, which every message
carries in its run config, nor from anything else a message carries.
"""

from __future__ import annotations

import math

import numpy as np

SCHEMES = ("poisson", "fixed")
#: label of the server's cohort draw in its NoiseSource (registry/streams.py NOISE_STREAMS lists it beside the
#: noise streams: secret, never derived from the run seed)
STREAM_CLIENT_SAMPLING = 0xC0407
#: the neighbouring relation each scheme is accounted under (what dp_accounting's RdpAccountant supports:
#: PoissonSampledDpEvent under add/remove, SampledWithoutReplacementDpEvent under replace-one)
RELATION = {"poisson": "add-remove", "fixed": "replace-one"}


def check_fraction(fraction: float) -> None:
    """Refuse a sampling fraction outside (0, 1]."""
    if not (isinstance(fraction, (int, float)) and math.isfinite(fraction) and 0 < fraction <= 1):
        raise ValueError(f"client fraction q must be in (0, 1], got {fraction!r}")


def fixed_cohort_size(fraction: float, population: int) -> int:
    """m = round(q N), half up (0.25 x 10 -> 3); ValueError when it is 0 (nobody would be sampled)."""
    check_fraction(fraction)
    if population < 1:
        raise ValueError(f"population must be >= 1, got {population}")
    m = min(population, int(math.floor(fraction * population + 0.5)))
    if m < 1:
        raise ValueError(f"client fraction {fraction:g} x {population} members rounds to 0 clients per round "
                         f"(fixed-size sampling needs q N >= 0.5)")
    return m


def expected_cohort(scheme: str, fraction: float, population: int) -> float:
    """The cohort size the release is normalised by and its noise sized for: q N (Poisson: the expected
    cohort, DP-FedAvg's fixed denominator) or round(q N) (fixed size). q = 1 gives N in both."""
    if scheme not in SCHEMES:
        raise ValueError(f"sampling scheme must be one of {SCHEMES}, got {scheme!r}")
    check_fraction(fraction)
    if scheme == "fixed":
        return float(fixed_cohort_size(fraction, population))
    return fraction * population


def poisson_cohort(population: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Members 0..population-1 each included independently with probability ``fraction`` (sorted indices)."""
    check_fraction(fraction)
    return np.flatnonzero(rng.random(population) < fraction)


def fixed_size_cohort(population: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` members of 0..population-1, uniformly without replacement (sorted indices)."""
    if not 1 <= size <= population:
        raise ValueError(f"cohort size must be in [1, {population}], got {size}")
    return np.sort(rng.choice(population, size=size, replace=False))


class CohortSampler:
    """The server's per-round draw over ``num_clients`` clients and ``num_extra`` further members.

    The extra members are the audit's inserted canaries (strategies.canaries): under sampling they are
    cohort members like any client, drawn in the same draw (so a fixed-size cohort counts them too).
    Each round is drawn once, in round order, and kept: every layer of a composition that asks for round
    r's cohort (the strategy that plans the messages, the canary insertion) gets the same answer.

    Parameters
    ----------
    scheme : "poisson" or "fixed" (:data:`SCHEMES`).
    fraction : q in (0, 1].
    num_clients : N, the clients (members 0..N-1, in the strategy's client order).
    rng : the server's secret generator (``NoiseSource.numpy_generator(STREAM_CLIENT_SAMPLING, ...)``).
    num_extra : K, members N..N+K-1 (inserted audit canaries).
    """

    def __init__(self, scheme: str, fraction: float, num_clients: int, rng: np.random.Generator,
                 num_extra: int = 0) -> None:
        if num_clients < 1 or num_extra < 0:
            raise ValueError(f"need num_clients >= 1 and num_extra >= 0, got {num_clients}, {num_extra}")
        self.scheme = scheme
        self.fraction = float(fraction)
        self.num_clients = int(num_clients)
        self.num_extra = int(num_extra)
        self.cohort_size = expected_cohort(scheme, fraction, self.population)  # validates scheme and q
        self.rng = rng
        self._drawn: dict[int, np.ndarray] = {}

    @property
    def population(self) -> int:
        return self.num_clients + self.num_extra

    @property
    def relation(self) -> str:
        """The neighbouring relation this scheme is accounted under (:data:`RELATION`)."""
        return RELATION[self.scheme]

    def members(self, server_round: int) -> np.ndarray:
        """Round ``server_round``'s members (sorted indices into the population), drawn on first request."""
        if server_round not in self._drawn:
            if self._drawn and server_round < max(self._drawn):
                raise ValueError(f"round {server_round} asked after round {max(self._drawn)}: draws go in round order")
            if self.scheme == "poisson":
                drawn = poisson_cohort(self.population, self.fraction, self.rng)
            else:
                drawn = fixed_size_cohort(self.population, int(self.cohort_size), self.rng)
            self._drawn[server_round] = drawn
        return self._drawn[server_round]

    def clients(self, server_round: int) -> np.ndarray:
        """The sampled clients' positions in 0..N-1."""
        m = self.members(server_round)
        return m[m < self.num_clients]

    def extras(self, server_round: int) -> np.ndarray:
        """The sampled extra members' positions in 0..K-1."""
        m = self.members(server_round)
        return m[m >= self.num_clients] - self.num_clients

    def describe(self) -> dict:
        """What a run summary records about the sampling (never the draws)."""
        return {"client_sampling": self.scheme, "client_fraction": self.fraction, "sampling_population": self.population,
                "sampling_cohort": self.cohort_size, "sampling_relation": self.relation}
