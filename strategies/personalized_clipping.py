"""Personalized DP on the server: each client's clipped update gets its own noise SD (a wrapper).

Seed paper on anonymization to personalized DP budgets (tabular-pdp): the trusted server clips
each update w_i - w to C and adds N(0, sigma_i^2 I) with client i's SD from
privacy.personalized.personalized_sigmas (sqrt(m) n_eps A~_i C, A~ the normalized ARIREC risks
of this round's cohort), then delegates aggregation. Same composition as
strategies.server_fixed_clipping (clip, noise, delegate), with the noise added per client.

Threat model: the server is trusted; the noise hides each client's update from the other clients
and from anyone who sees the released models. The cohort m is the planned clients whose replies
arrived valid (strategies.cohorts.check_replies); noise comes from ``rng`` (privacy.randomness).
Audit canaries (strategies.canaries.WeightedCanaries) are cohort members: each takes its client's
ARIREC (so the risks are normalized over real clients and canaries together, m counts both), gets
its own sigma_k, and joins the weighted mean with its client's weight.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy

from privacy.mechanisms import clip_by_l2, gaussian_noise_like
from privacy.personalized import personalized_sigmas
from strategies.canaries import WeightedCanaries, mix_into_weighted_mean, real_weight
from strategies.records import from_numpy, to_numpy
from strategies.wrapper import ClippingWrapper


class PersonalizedServerSideClipping(ClippingWrapper):
    """Trusted-server PDP: clip each update to C, add N(0, sigma_i^2 I), delegate aggregation.

    Parameters
    ----------
    strategy : the aggregation to wrap (a fixed-cohort FedAvg).
    noise_multiplier : the global n_eps the personalized multipliers average to.
    clipping_norm : C.
    risks : client id -> ARIREC A_i (> 0). Each round the risks of the clients that replied
        are normalized among themselves (m = that cohort).
    rng : the noise generator.
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float,
                 risks: Mapping[int, float], rng: np.random.Generator,
                 canaries: WeightedCanaries | None = None) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, rng, canaries)
        if canaries is not None and canaries.risks is None:
            raise ValueError("PDP canaries need risks (each takes its client's ARIREC)")
        self.risks = {int(k): float(v) for k, v in risks.items()}

    def sigmas_for(self, client_ids: list[int]) -> dict[int, float]:
        """sigma_i of each client in this cohort (audit canaries, if any, are cohort members too)."""
        return self._cohort_sigmas(client_ids)[0]

    def _cohort_sigmas(self, client_ids: list[int]) -> tuple[dict[int, float], np.ndarray]:
        missing = [c for c in client_ids if c not in self.risks]
        if missing:
            raise KeyError(f"no ARIREC for client(s) {missing}")
        extra = [] if self.canaries is None else list(self.canaries.risks)
        s = personalized_sigmas([self.risks[c] for c in client_ids] + extra, self.noise_multiplier,
                                self.clipping_norm)
        n = len(client_ids)
        return dict(zip(client_ids, (float(x) for x in s[:n]))), np.asarray(s[n:], dtype=np.float64)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        checked = self.check(server_round, replies)
        ids = checked.contributors  # sorted: each client's draw does not depend on arrival order
        if not ids:
            return None, None
        sigmas, canary_sigmas = self._cohort_sigmas(ids)
        cur = to_numpy(self.current_arrays)
        norms = {}
        for cid in ids:
            r = checked.reply_of[cid]
            w = to_numpy(r.content["arrays"])
            delta = [w[k].astype(np.float64) - cur[k] for k in cur]
            clipped, norms[cid], _ = clip_by_l2(delta, self.clipping_norm)
            noise = gaussian_noise_like(clipped, sigmas[cid], self.rng)
            r.content["arrays"] = from_numpy(OrderedDict(
                (k, (cur[k] + d + z).astype(w[k].dtype)) for k, d, z in zip(cur, clipped, noise)))
        info = {"m": len(ids), "rejected": len(checked.rejected), "sigmas": sigmas, "update_norms": norms,
                "clipped": sum(v > self.clipping_norm for v in norms.values())}
        self.rounds[server_round] = info
        ok = checked.valid_by_client()
        arrays, metrics = self.strategy.aggregate_train(server_round, ok)
        if self.canaries is None or arrays is None:
            return arrays, metrics
        # Canaries: clipped (identity, norm <= C), noised with their own sigma_k, then in the weighted mean.
        w_real = real_weight(ok, getattr(self.strategy, "weighted_by_key", "num-examples"))
        updates = self.canaries.updates()
        noisy = updates + self.rng.standard_normal(updates.shape) * canary_sigmas[:, None]
        agg = mix_into_weighted_mean(to_numpy(arrays), cur, w_real, noisy, self.canaries.weights)
        total = w_real + float(self.canaries.weights.sum())
        p_real = np.array([float(checked.reply_of[c].content["metrics"][getattr(
            self.strategy, "weighted_by_key", "num-examples")]) for c in ids]) / total
        sigma_rel = float(np.sqrt(np.sum(p_real ** 2 * np.array([sigmas[c] for c in ids]) ** 2)
                                  + np.sum((self.canaries.weights / total) ** 2 * canary_sigmas ** 2)))
        info.update(canaries=self.canaries.num_inserted, sigma_release=sigma_rel,
                    canary_signal_over_sigma=self.canaries.signal_over_sigma(total, sigma_rel))
        return from_numpy(agg), metrics
