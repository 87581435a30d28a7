"""Personalized DP on the server: each client's clipped update gets its own noise SD (a wrapper).

Seed paper on anonymization to personalized DP budgets (tabular-pdp): the trusted server clips
each update w_i - w to C and adds N(0, sigma_i^2 I) with client i's SD from
privacy.personalized.personalized_sigmas (sqrt(m) n_eps A~_i C, A~ the normalized ARIREC risks
of this round's cohort), then delegates aggregation. Same composition as
strategies.server_fixed_clipping (clip, noise, delegate), with the noise added per client.

Threat model: the server is trusted; the noise hides each client's update from the other clients
and from anyone who sees the released models. The cohort m is the planned clients whose replies
arrived valid (strategies.cohorts.check_replies); noise comes from ``rng`` (privacy.randomness).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy

from privacy.mechanisms import clip_by_l2, gaussian_noise_like
from privacy.personalized import personalized_sigmas
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
                 risks: Mapping[int, float], rng: np.random.Generator) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, rng)
        self.risks = {int(k): float(v) for k, v in risks.items()}

    def sigmas_for(self, client_ids: list[int]) -> dict[int, float]:
        """sigma_i of each client in this cohort."""
        missing = [c for c in client_ids if c not in self.risks]
        if missing:
            raise KeyError(f"no ARIREC for client(s) {missing}")
        s = personalized_sigmas([self.risks[c] for c in client_ids], self.noise_multiplier, self.clipping_norm)
        return dict(zip(client_ids, (float(x) for x in s)))

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        checked = self.check(server_round, replies)
        ids = checked.contributors  # sorted: each client's draw does not depend on arrival order
        if not ids:
            return None, None
        sigmas = self.sigmas_for(ids)
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
        self.rounds[server_round] = {"m": len(ids), "rejected": len(checked.rejected), "sigmas": sigmas,
                                     "update_norms": norms,
                                     "clipped": sum(v > self.clipping_norm for v in norms.values())}
        return self.strategy.aggregate_train(server_round, checked.valid_by_client())
