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
ARIREC (so the risks are normalized over real clients and canaries together, m counts both), goes
through the same clip and noise as a real client (:meth:`PersonalizedServerSideClipping.privatize`)
with its own sigma_k, and joins the weighted mean with its client's weight. What the trusted server
then holds of each canary (its noised update) is handed to the auditor
(``WeightedCanaries.record_noised``): the personalized noise is what PDP's per-client promise is about.

Broken variants (``fault``, privacy/faults.py; tests only), reported sigmas and clip counters unchanged:
``noise-div-k`` adds N(0, (sigma_i / k)^2) to every member; ``wrong-cohort`` sizes the sigmas for
WRONG_COHORT_FACTOR x the cohort (every member's risk repeated: each sigma_i shrinks by sqrt(10)) and
reports them; ``skip-clip`` leaves every member's update unclipped; ``clip-after-noise`` adds each
member's noise to its unclipped update, then clips; ``pdp-one-client-noise-div-10`` adds sigma_0 / 10
to client 0 and to the canaries standing for it (a real client of its risk would get the same).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy

from privacy.faults import WRONG_COHORT_FACTOR, noise_divisor
from privacy.mechanisms import clip_by_l2, gaussian_noise_like, global_l2_norm
from privacy.personalized import personalized_sigmas
from strategies.canaries import WeightedCanaries, mix_into_weighted_mean, real_weight
from strategies.clipping_wrapper import ClippingWrapper
from strategies.records import array_record, from_numpy, number, to_numpy

ONE_CLIENT = 0  # the client whose personalized noise the pdp-one-client-noise-div-10 bug shrinks


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
    canaries : audit canaries (cohort members), or None.
    fault : '' (the mechanism) or one of ``FAULTS`` (a deliberately broken one, see the module doc).
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float,
                 risks: Mapping[int, float], rng: np.random.Generator,
                 canaries: WeightedCanaries | None = None, fault: str = "", keep_noise_state: bool = False) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, rng, canaries, fault, keep_noise_state)
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
        extra = [] if self.canaries is None else list(cast(np.ndarray, self.canaries.risks))  # not None: __init__
        members = [self.risks[c] for c in client_ids] + extra
        factor = WRONG_COHORT_FACTOR if self.fault == "wrong-cohort" else 1  # the bug: a cohort 10x too large
        s = personalized_sigmas(members * factor, self.noise_multiplier, self.clipping_norm)[:len(members)]
        n = len(client_ids)
        return dict(zip(client_ids, (float(x) for x in s[:n]))), np.asarray(s[n:], dtype=np.float64)

    def noise_sd(self, sigma: float, client: int) -> float:
        """The SD of the noise actually added to a member with reported ``sigma`` standing for ``client``."""
        if self.fault == "pdp-one-client-noise-div-10" and client == ONE_CLIENT:
            return sigma / 10
        return sigma / noise_divisor(self.fault)

    def privatize(self, update: list[np.ndarray], sigma: float, client: int) -> tuple[list[np.ndarray], float]:
        """One member's update (float64 arrays): clip to C, add N(0, sigma^2 I); (noised update, norm before)."""
        sd = self.noise_sd(sigma, client)
        if self.fault == "clip-after-noise":  # the bug: noise first, then the clip
            noise = gaussian_noise_like(update, sd, self.rng)
            norm = global_l2_norm(update)
            return clip_by_l2([d + z for d, z in zip(update, noise)], self.clipping_norm)[0], norm
        clipped, norm, _ = clip_by_l2(update, self.clipping_norm)
        if self.fault == "skip-clip":
            clipped = update
        noise = gaussian_noise_like(clipped, sd, self.rng)
        return [d + z for d, z in zip(clipped, noise)], norm

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
            w = to_numpy(array_record(r.content["arrays"]))
            delta = [w[k].astype(np.float64) - cur[k] for k in cur]
            noised, norms[cid] = self.privatize(delta, sigmas[cid], cid)
            r.content["arrays"] = from_numpy(OrderedDict(
                (k, (cur[k] + d).astype(w[k].dtype)) for k, d in zip(cur, noised)))
        info = {"m": len(ids), "rejected": len(checked.rejected), "sigmas": sigmas, "update_norms": norms,
                "clipped": sum(v > self.clipping_norm for v in norms.values())}
        self.rounds[server_round] = info
        ok = checked.valid_by_client()
        arrays, metrics = self.strategy.aggregate_train(server_round, ok)
        if self.canaries is None or arrays is None:
            return arrays, metrics
        # Canaries: cohort members through the same clip and noise (their own sigma_k), then in the weighted mean.
        w_real = real_weight(ok, self.weight_key)
        updates = self.canaries.updates()
        noisy = np.empty(updates.shape, dtype=np.float64)
        for j, (u, sd, g) in enumerate(zip(updates, canary_sigmas, self.canaries.groups)):
            noisy[j] = self.privatize([u.astype(np.float64)], float(sd), int(g))[0][0]
            self.canaries.record_noised(server_round, j, noisy[j])  # what the trusted server holds of it
        agg = mix_into_weighted_mean(to_numpy(arrays), cur, w_real, noisy, self.canaries.weights)
        total = w_real + float(self.canaries.weights.sum())
        key = self.weight_key
        p_real = np.array([float(number(checked.reply_of[c].content["metrics"][key])) for c in ids]) / total
        sigma_rel = float(np.sqrt(np.sum(p_real ** 2 * np.array([sigmas[c] for c in ids]) ** 2)
                                  + np.sum((self.canaries.weights / total) ** 2 * canary_sigmas ** 2)))
        info.update(canaries=self.canaries.num_inserted, sigma_release=sigma_rel,
                    canary_sigmas=[float(x) for x in canary_sigmas],
                    canary_signal_over_sigma=self.canaries.signal_over_sigma(total, sigma_rel))
        return from_numpy(agg), metrics
