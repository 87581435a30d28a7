"""Server-side DP wrappers for the tabular-pdp study: Flower's GDP, seeded, and ARIREC-personalized PDP.

GDP. Flower 1.42's ``DifferentialPrivacyServerSideFixedClipping`` (flwr/serverapp/strategy/
dp_fixed_clipping.py) clips every reply's update w_i - w to norm C, lets the wrapped
strategy aggregate, then adds N(0, sigma^2 I) with sigma = noise_multiplier * C /
num_sampled_clients (``compute_stdv``) to the aggregate. Two things differ from what the
paper's formula n_eps C / m assumes, and :class:`SeededServerSideFixedClipping` changes
exactly those two hooks and nothing else:

* the noise comes from NumPy's *global* ``np.random.normal`` (unseedable per run, shared with
  every other library) -> here an explicit ``np.random.Generator`` from privacy.randomness
  (OS entropy by default: no client can reproduce it from what its messages carry);
* m is the *configured* ``num_sampled_clients``, not the number of clients that replied: with
  a failed or excluded client the noise is sized for a cohort that did not contribute ->
  here m = the planned clients whose replies arrived valid, each round
  (strategies.cohorts.check_replies: a reply speaking for another client is rejected).

Threat model (both wrappers): the server is trusted; the noise hides each client's update from
the other clients and from anyone who sees the released models.

A third weakness is only guarded: Flower's ``clip_inputs_inplace`` divides by the update's
norm, so a client returning the model unchanged raises ZeroDivisionError; here that is a
ValueError naming the client, raised before Flower's code runs.

Clipping, delegation to FedAvg and Flower's reply validation are Flower's. With FedAvg
weighted by client sizes the aggregate is w + sum_i p_i clip(Delta_i), p_i = n_i / sum n_j;
sigma = n_eps C / m matches the sensitivity C / m of equal weights (sizes here differ by
< 5%); the per-client accounting uses each client's p_i C.

PDP. :class:`PersonalizedServerSideClipping` keeps the same composition (clip, add noise,
delegate aggregation) but adds noise to each clipped update before aggregation, with
client i's SD from privacy.personalized.personalized_sigmas (sqrt(m) n_eps A~_i C).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, Strategy
from flwr.supercore.differential_privacy import compute_stdv

from privacy.mechanisms import clip_by_l2, gaussian_noise_like, global_l2_norm
from privacy.personalized import personalized_sigmas
from strategies.cohorts import CheckedReplies, check_replies
from strategies.records import from_numpy, to_numpy
from strategies.tabular_fedavg import reply_client_id

log = logging.getLogger(__name__)


def update_norms(replies: Iterable[Message], current: ArrayRecord) -> dict[int, float]:
    """||w_i - w|| of every valid reply's ``arrays``, by client id."""
    cur = to_numpy(current)
    out = {}
    for r in replies:
        if r.has_error():
            continue
        w = to_numpy(r.content["arrays"])
        out[reply_client_id(r)] = global_l2_norm([w[k].astype(np.float64) - cur[k] for k in cur])
    return out


class SeededServerSideFixedClipping(DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side fixed-clipping GDP with an explicit generator and m = actual replies.

    ``rounds`` records, per round, the sigma used, the cohort size and the update norms.
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float,
                 num_sampled_clients: int, rng: np.random.Generator) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, num_sampled_clients)
        self.rng = rng
        self.rounds: dict[int, dict] = {}
        self._round = 0
        self._sent: list[Message] = []

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._sent = list(super().configure_train(server_round, arrays, config, grid))
        return self._sent

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        checked = _checked(self._sent, replies, server_round)
        ok = checked.valid
        self._round = server_round
        norms = update_norms(ok, self.current_arrays)
        zero = sorted(c for c, v in norms.items() if v == 0)
        if zero:
            raise ValueError(f"round {server_round}: client(s) {zero} returned the model unchanged (zero update); "
                             "Flower's server-side clipping divides by the update norm")
        # Noise for the planned clients that actually contributed (never for a forged cohort).
        self.num_sampled_clients = max(1, len(checked.contributors))
        self.rounds[server_round] = {"m": len(checked.contributors), "rejected": len(checked.rejected),
                                     "update_norms": norms,
                                     "clipped": sum(v > self.clipping_norm for v in norms.values())}
        # Only the valid replies go on: Flower's wrapper would skip the whole round on one error
        # reply, which would let a single participant veto every release by lying.
        return super().aggregate_train(server_round, ok)

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays: ArrayRecord) -> ArrayRecord:
        sigma = compute_stdv(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients)
        arrays = to_numpy(aggregated_arrays)
        noise = gaussian_noise_like(list(arrays.values()), sigma, self.rng)
        self.rounds.setdefault(self._round, {})["sigma"] = sigma
        return from_numpy(OrderedDict((k, v + z) for (k, v), z in zip(arrays.items(), noise)))


class PersonalizedServerSideClipping(Strategy):
    """Trusted-server PDP: clip each update to C, add N(0, sigma_i^2 I), delegate aggregation.

    Parameters
    ----------
    strategy : the aggregation to wrap (ClientFedAvg).
    noise_multiplier : the global n_eps the personalized multipliers average to.
    clipping_norm : C.
    risks : client id -> ARIREC A_i (> 0). Each round the risks of the clients that replied
        are normalized among themselves (m = that cohort).
    rng : the noise generator.
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float,
                 risks: Mapping[int, float], rng: np.random.Generator) -> None:
        super().__init__()
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if not clipping_norm > 0:
            raise ValueError(f"clipping_norm must be > 0, got {clipping_norm}")
        self.strategy = strategy
        self.noise_multiplier = noise_multiplier
        self.clipping_norm = clipping_norm
        self.risks = {int(k): float(v) for k, v in risks.items()}
        self.rng = rng
        self.current_arrays = ArrayRecord()
        self.rounds: dict[int, dict] = {}
        self._sent: list[Message] = []

    def summary(self) -> None:
        log.info("PDP (ARIREC-personalized, server-side): n_eps %s, C %s", self.noise_multiplier, self.clipping_norm)
        self.strategy.summary()

    def sigmas_for(self, client_ids: list[int]) -> dict[int, float]:
        """sigma_i of each client in this cohort."""
        missing = [c for c in client_ids if c not in self.risks]
        if missing:
            raise KeyError(f"no ARIREC for client(s) {missing}")
        s = personalized_sigmas([self.risks[c] for c in client_ids], self.noise_multiplier, self.clipping_norm)
        return dict(zip(client_ids, (float(x) for x in s)))

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.current_arrays = arrays
        self._sent = list(self.strategy.configure_train(server_round, arrays, config, grid))
        return self._sent

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        checked = _checked(self._sent, replies, server_round)
        # Sorted by client id: each client's noise draw does not depend on the arrival order.
        ok = sorted(checked.valid, key=reply_client_id)
        if checked.failed:
            log.info("PDP round %d: %d error or rejected replies dropped", server_round, len(checked.failed))
        if not ok:
            return None, None
        ids = [reply_client_id(r) for r in ok]
        sigmas = self.sigmas_for(ids)
        cur = to_numpy(self.current_arrays)
        norms = {}
        for r, cid in zip(ok, ids):
            w = to_numpy(r.content["arrays"])
            delta = [w[k].astype(np.float64) - cur[k] for k in cur]
            clipped, norms[cid], _ = clip_by_l2(delta, self.clipping_norm)
            noise = gaussian_noise_like(clipped, sigmas[cid], self.rng)
            r.content["arrays"] = from_numpy(OrderedDict(
                (k, (cur[k] + d + z).astype(w[k].dtype)) for k, d, z in zip(cur, clipped, noise)))
        self.rounds[server_round] = {"m": len(ok), "rejected": len(checked.rejected), "sigmas": sigmas, "update_norms": norms,
                                     "clipped": sum(v > self.clipping_norm for v in norms.values())}
        return self.strategy.aggregate_train(server_round, ok)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)


def _checked(sent: list[Message], replies: Iterable[Message], server_round: int) -> CheckedReplies:
    """Replies matched to this round's plan (one client per message, model under ``arrays``)."""
    checked = check_replies(sent, replies, array_claims="none")
    for reason in checked.rejected:
        log.warning("round %d: %s; counted as a failed client", server_round, reason)
    return checked
