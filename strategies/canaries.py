"""Canary clients inside the trusted aggregation, for the client-level audit (privacy/audit/).

A canary is an extra member of the cohort whose update is the auditor's canary vector
(privacy.audit.canaries: the studies draw norms of 2C-10C, issue 37, so that the clip each canary
passes through, the same code as a real client's, decides its signal). It enters BEFORE the noise,
and the cohort size m that sizes the noise counts it like any real client. The auditor then sees
only the released (noised) models. Three insertion points, one per aggregation shape:

* :class:`CanaryInsertion` wraps a pattern strategy under ``MatchedPerturbation`` (dfl-dp; a
  strategies.wrapper.StrategyWrapper).
  FL (Algorithm 1): each canary's model w(t) + c_k is a cohort member's reply: it passes through
  ``MatchedPerturbation``'s per-client clip (the same code as the real replies, handed over by
  :meth:`CanaryInsertion.clip_members_with`), and the equal-weight mean runs over the N real and
  the K_in canary clipped models. Sequential DFL (Algorithm 2): each canary is one more hop at the
  end of the chain (the token becomes token + c_k), so the round update is clipped with the
  canaries in it, as a real hop would be. It reports ``num-canaries`` so that
  ``MatchedPerturbation`` sizes sigma_abs by N + K_in contributors. Canaries above C (issue 37:
  norm_range (2, 10)) test the clip they pass through: a skipped clip lets them in at full norm.
* :func:`mix_into_weighted_mean` for the size-weighted FedAvg of the tabular DP wrappers
  (``ServerSideFixedClipping``, ``PersonalizedServerSideClipping``): canary k has weight n_k (the
  size of the client it stands for); the result is what FedAvg would return with the canaries
  among its replies.

Under client sampling (``sampler``, privacy.sampling) the inserted canaries are members of the
population the server samples from (members N..N+K_in-1 of its draw): a canary joins a round only when
the draw picks it, like a client, and a Poisson round whose draw holds canaries but no client releases
the canaries' mean (FL) or their sum (the chain) plus noise. Which rounds held a canary is the server's
secret, as for a client: the auditor scores every release (privacy/audit).

Threat model: the server (and this code in it) is trusted; the canaries are the auditor's, injected
where a trusted auditor would inject them (Andrew et al., ICLR 2024, Sec. 3).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from privacy.audit.canaries import CanarySet
from privacy.audit.client_level import flat_params, float_keys, split_like
from privacy.sampling import CohortSampler
from strategies.layer import MemberClip, layer_of
from strategies.records import from_numpy, number, to_numpy
from strategies.wrapper import StrategyWrapper

log = logging.getLogger(__name__)
PLACEMENTS = ("cohort-mean", "chain-end")


def canary_sum(canaries: CanarySet, indices: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """sum_k w_k c_k over ``indices`` (flat, float64)."""
    w = np.ones(indices.size) if weights is None else np.asarray(weights, dtype=np.float64)
    return w @ canaries.vectors[indices] if indices.size else np.zeros(canaries.dim)


def add_flat(model: Mapping[str, np.ndarray], flat_change: np.ndarray) -> OrderedDict[str, np.ndarray]:
    """``model`` + a flat change on its float arrays (other arrays kept), each array in its own dtype."""
    pieces = split_like(flat_change, model)
    return OrderedDict((k, (np.asarray(v, dtype=np.float64) + pieces[k]).astype(np.asarray(v).dtype)
                        if k in pieces else v) for k, v in model.items())


def mix_into_weighted_mean(aggregate: Mapping[str, np.ndarray], current: Mapping[str, np.ndarray],
                           real_weight: float, canary_updates: np.ndarray, canary_weights: np.ndarray
                           ) -> OrderedDict[str, np.ndarray]:
    """FedAvg with the canaries among the replies: cur + (W (agg - cur) + sum_k n_k u_k) / (W + sum_k n_k).

    ``aggregate`` is the weighted mean of the real replies (total weight ``real_weight``),
    ``canary_updates`` (K_in, d) the canaries' (possibly noised) updates.
    """
    if canary_updates.shape[0] != canary_weights.size:
        raise ValueError(f"{canary_updates.shape[0]} canary updates but {canary_weights.size} weights")
    if not real_weight > 0 or np.any(canary_weights <= 0):
        raise ValueError("weights must be > 0")
    keys = float_keys(current)
    agg_flat = np.concatenate([np.asarray(aggregate[k], dtype=np.float64).ravel() for k in keys])
    cur_flat = np.concatenate([np.asarray(current[k], dtype=np.float64).ravel() for k in keys])
    total = real_weight + float(canary_weights.sum())
    change = (real_weight * (agg_flat - cur_flat) + canary_weights @ canary_updates) / total
    out = add_flat(current, change)
    return OrderedDict((k, out[k] if k in out and k in keys else aggregate[k]) for k in aggregate)


class CanaryInsertion(StrategyWrapper):
    """Wrap a pattern strategy: add the inserted canaries to each round's aggregate (see module doc).

    Parameters
    ----------
    strategy : EqualWeightFedAvg (placement "cohort-mean") or SequentialDFL ("chain-end").
    canaries : the auditor's canaries; the inserted ones take part in every round (or when the draw picks them).
    placement : "cohort-mean" or "chain-end".
    sampler : the server's cohort draw (client sampling; its extra members are the inserted canaries, in
        order), shared with the strategy that plans the messages; None = every canary every round.
    """

    def __init__(self, strategy: Strategy, canaries: CanarySet, placement: str,
                 sampler: CohortSampler | None = None) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        weights = layer_of(strategy).member_weights
        if weights != "equal":
            # the cohort mean below gives the real clients total weight = their number (one each)
            raise ValueError(f"canaries join a mean of equal-weight members; {type(strategy).__name__} "
                             f"weights them by {weights!r}")
        super().__init__(strategy)
        self.canaries = canaries
        self.placement = placement
        self._inserted = canaries.inserted_indices()
        if sampler is not None and sampler.num_extra != self._inserted.size:
            raise ValueError(f"the sampler draws {sampler.num_extra} extra members, {self._inserted.size} canaries "
                             "are inserted")
        self.sampler = sampler
        self._sum_cache: np.ndarray | None = None  # sum_k c_k, computed once when first needed
        self._current: OrderedDict[str, np.ndarray] | None = None
        self._clip: MemberClip | None = None

    def clip_members_with(self, clip: MemberClip) -> None:
        """Pass each canary's model through ``clip(round, who, model)``, the client clip of the DP wrapper
        (``MatchedPerturbation`` calls this for FL). Without it the canaries enter as they are. The canaries are
        this layer's members, so the clip stops here (the wrapped strategy's members are the real replies)."""
        self._clip = clip

    @property
    def _sum(self) -> np.ndarray:
        """sum_k c_k over the inserted canaries (flat, float64); unused when a clip is set (FL), so not
        computed at construction: it copies the K_in x d canary rows."""
        if self._sum_cache is None:
            self._sum_cache = canary_sum(self.canaries, self._inserted)
        return self._sum_cache

    def round_canaries(self, server_round: int) -> np.ndarray:
        """The inserted canaries (indices into the canary set) that take part in round ``server_round``."""
        if self.sampler is None:
            return self._inserted
        return self._inserted[self.sampler.extras(server_round)]

    def _clipped_sum(self, server_round: int, present: np.ndarray) -> np.ndarray:
        """sum_k clip(w(t) + c_k) - w(t) over the ``present`` inserted canaries (flat, float64): each canary's
        model is a reply like a real client's, in the model's dtype, through the wrapper's client clip."""
        assert self._current is not None
        if self._clip is None:
            return self._sum if present is self._inserted else canary_sum(self.canaries, present)
        cur_flat = flat_params(self._current)
        total = np.zeros(self.canaries.dim)
        for k in present:
            reply = add_flat(self._current, np.asarray(self.canaries.vectors[k], dtype=np.float64))
            total += flat_params(self._clip(server_round, f"canary-{int(k)}", reply)) - cur_flat
        return total

    def summary(self) -> None:
        log.info("CanaryInsertion(%d of %d canaries, %s) wrapping:", self._inserted.size,
                 self.canaries.vectors.shape[0], self.placement)
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._current = to_numpy(arrays)
        if flat_size(self._current) != self.canaries.dim:
            raise ValueError(f"the model has {flat_size(self._current)} float parameters, "
                             f"the canaries live in R^{self.canaries.dim}")
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if self._current is None:
            raise RuntimeError("aggregate_train called before configure_train")
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        present = self.round_canaries(server_round)
        k_in = int(present.size)
        metrics = MetricRecord() if metrics is None else metrics
        real = int(number(metrics.get("num-contributors", 0)))
        if arrays is None or real == 0:
            if self.sampler is None or k_in == 0:
                # No real client contributed: nothing is released this round, canaries included.
                return arrays, metrics
            # A sampled round whose draw holds canaries and no (valid) client: the canaries are the cohort.
            change = self._clipped_sum(server_round, present)
            model = add_flat(self._current, change / k_in if self.placement == "cohort-mean" else change)
            metrics["num-canaries"] = k_in
            return from_numpy(model), metrics
        if k_in == 0:  # a sampled round that drew no canary
            metrics["num-canaries"] = 0
            return arrays, metrics
        agg = to_numpy(arrays)
        if self.placement == "cohort-mean":  # k_in members whose updates sum to S: one row S / k_in of weight k_in
            model = mix_into_weighted_mean(agg, self._current, float(real),
                                           (self._clipped_sum(server_round, present) / k_in)[None, :],
                                           np.array([float(k_in)]))
        else:  # k_in more hops, each adding its canary to the token
            model = add_flat(agg, self._sum if present is self._inserted else canary_sum(self.canaries, present))
        metrics["num-canaries"] = k_in
        return from_numpy(model), metrics


def flat_size(model: Mapping[str, np.ndarray]) -> int:
    """Number of float parameters (the canaries' dimension)."""
    return int(sum(np.asarray(model[k]).size for k in float_keys(model)))


class WeightedCanaries:
    """Canaries for a size-weighted FedAvg: canary k stands for client ``groups[k]`` and takes its weight.

    The tabular DP wrappers (strategies.server_fixed_clipping, strategies.personalized_clipping) treat
    each inserted canary as a cohort member: its update c_k goes through the same clip (and, PDP, the
    same personalized noise) as a real client's, so canaries above C (issue 37, norm_range (2, 10))
    test that clip. Under PDP the wrapper hands each canary's noised update to :meth:`record_noised`.

    Parameters
    ----------
    canaries : the auditor's canaries; ``canaries.groups`` are client ids.
    weights : client id -> FedAvg weight (its number of training examples).
    risks : client id -> ARIREC (PDP only: a canary gets the privacy risk, hence the noise, of its client).
    """

    def __init__(self, canaries: CanarySet, weights: Mapping[int, float],
                 risks: Mapping[int, float] | None = None) -> None:
        missing = sorted({int(g) for g in canaries.groups} - {int(c) for c in weights})
        if missing:
            raise ValueError(f"no weight for the client(s) {missing} that canaries stand for")
        self.canaries = canaries
        self.index = canaries.inserted_indices()
        self.groups = canaries.groups[self.index].astype(int)
        self.weights = np.array([float(weights[g]) for g in self.groups])
        if np.any(self.weights <= 0):
            raise ValueError("canary weights must be > 0")
        self.risks = None if risks is None else np.array([float(risks[g]) for g in self.groups])
        #: group -> [(round, projections)]: each noised canary update along its group's held-out directions
        self.noised_projections: dict[int, list[tuple[int, np.ndarray]]] = {}
        self._held_out_units: dict[int, np.ndarray] = {}

    @property
    def num_inserted(self) -> int:
        return int(self.index.size)

    def updates(self) -> np.ndarray:
        """The inserted canaries' updates (K_in, d), unclipped (the wrapper clips them like any member's)."""
        return self.canaries.vectors[self.index]

    def held_out_units(self, group: int) -> np.ndarray:
        """(K_out of ``group``, d) float64: the unit directions of the group's held-out canaries."""
        if group not in self._held_out_units:
            idx = np.flatnonzero(~self.canaries.inserted & (self.canaries.groups == group))
            self._held_out_units[group] = (self.canaries.vectors[idx].astype(np.float64)
                                           / self.canaries.norms[idx][:, None])
        return self._held_out_units[group]

    def record_noised(self, server_round: int, position: int, noised_update: np.ndarray) -> None:
        """What the trusted server holds of inserted canary ``position`` after its personalized noise (PDP).

        Kept: its components along the held-out canaries' unit directions of the same client group, each
        made orthogonal to this canary's own direction. The member's update before the noise is a multiple
        of its canary c_k (clipped or not), so these components are pure noise of the member's SD:
        privacy.audit.verdict.noise_test compares them with the SD the configuration gives a client of
        that risk. (A noise added before a clip comes out scaled down with it.)
        """
        g = int(self.groups[position])
        units = self.held_out_units(g)
        own = self.canaries.vectors[self.index[position]].astype(np.float64)
        own /= np.linalg.norm(own)
        x = np.asarray(noised_update, dtype=np.float64)
        cos = units @ own
        proj = (units @ x - cos * float(own @ x)) / np.sqrt(1.0 - cos ** 2)
        self.noised_projections.setdefault(g, []).append((int(server_round), proj))

    def signal_over_sigma(self, total_weight: float, sigma_release: float) -> dict[int, float]:
        """Per client group: the canary's contribution p_k C over the release's noise SD (for the formal epsilon)."""
        out: dict[int, float] = {}
        for g, w in zip(self.groups, self.weights):
            out[int(g)] = math.inf if sigma_release == 0 else float(w / total_weight * self.canaries.clip_norm
                                                                     / sigma_release)
        return out


def real_weight(replies: Iterable[Message], key: str = "num-examples") -> float:
    """Total FedAvg weight of ``replies`` (their ``metrics[key]``)."""
    return float(sum(float(number(r.content["metrics"][key])) for r in replies))
