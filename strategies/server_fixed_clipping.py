"""Central DP with fixed clipping, composed around any strategy (Flower's algorithm, fixed).

Flower 1.42's ``DifferentialPrivacyServerSideFixedClipping`` (flwr/serverapp/strategy/
dp_fixed_clipping.py) clips every reply's update w_i - w to norm C, lets the wrapped strategy
aggregate, then adds N(0, sigma^2 I) with sigma = noise_multiplier * C / num_sampled_clients.
This wrapper runs the same steps with Flower's own clipping and sigma functions
(``flwr.supercore.differential_privacy``, through strategies.flwr_adapter), and differs where Flower's class is unsafe:

* noise from an explicit ``np.random.Generator`` (privacy.randomness: OS entropy by default,
  so no client can reproduce it), not NumPy's global ``np.random.normal``;
* sigma sized by m = the planned clients whose replies arrived valid this round
  (strategies.cohorts.check_replies), not the configured cohort: a failed client raises the
  noise, a reply speaking for other clients is rejected, and no participant can shrink sigma;
* an error or rejected reply is dropped and the round goes on (Flower skips the whole round,
  which would let one participant veto every release);
* an unchanged model (zero update) is kept as it is (Flower divides by its norm).

Audit canaries (``canaries``, strategies.canaries.WeightedCanaries) are cohort members: each
canary's update goes through the same clip (``clip_model_update``, Flower's math) as a real
client's, joins the weighted mean with its client's weight and counts in m, before the noise.

Broken variants (``fault``, privacy/faults.py; tests only), reported sigma and clip counters unchanged:
``noise-div-k`` adds N(0, (sigma / k)^2); ``wrong-cohort`` sizes sigma for WRONG_COHORT_FACTOR x
(m + K_in) and reports it; ``skip-clip`` leaves every member's update (canaries too) unclipped;
``clip-after-noise`` averages the unclipped updates, adds the noise, then clips the round's noised
update to C; ``pdp-one-client-noise-div-10`` is a PDP bug and changes nothing here.

Threat model: the server is trusted; the noise hides each client's update from the other
clients and from anyone who sees the released models. With equal weights the sensitivity of
the mean is C / m; a size-weighted FedAvg gives client i weight p_i (accounting uses p_i C).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from privacy.audit.client_level import float_keys
from privacy.faults import WRONG_COHORT_FACTOR, noise_divisor
from privacy.mechanisms import gaussian_noise_like, global_l2_norm
from strategies.canaries import mix_into_weighted_mean, real_weight
from strategies.clipping_wrapper import ClippingWrapper
from strategies.flwr_adapter import flower_clip_model_update, flower_stdv
from strategies.records import array_record, from_numpy, to_numpy


def clip_model_update(params: list[np.ndarray], current: list[np.ndarray], clipping_norm: float,
                      clip: bool = True) -> float:
    """Clip the update params - current to ``clipping_norm`` in place (Flower's math); returns its norm.

    ``clip=False`` only measures (the skip-clip bug's path: the norm is still recorded).
    """
    norm = global_l2_norm([p.astype(np.float64) - c for p, c in zip(params, current)])
    if clip and norm > 0:  # a zero update needs no clipping (and Flower's division would fail)
        flower_clip_model_update(params, current, clipping_norm)
    return norm


def clip_reply_update(reply: Message, current: OrderedDict[str, np.ndarray], clipping_norm: float,
                      key: str = "arrays", clip: bool = True) -> float:
    """Clip ``reply``'s update w_i - w to ``clipping_norm`` in place (Flower's math); returns its norm."""
    w = to_numpy(array_record(reply.content[key]))
    params = [w[k] for k in current]
    norm = clip_model_update(params, list(current.values()), clipping_norm, clip)
    reply.content[key] = from_numpy(OrderedDict(zip(current, params)))
    return norm


class ServerSideFixedClipping(ClippingWrapper):
    """Clip each update to ``clipping_norm``, delegate aggregation, add N(0, (z C / m)^2 I).

    ``rounds`` records, per round, sigma, the cohort size m, rejections and the update norms.
    """

    def clipped_canary_updates(self) -> np.ndarray:
        """The inserted canaries' updates (K_in, d) after the same clip as the real clients' (float64)."""
        assert self.canaries is not None
        out = self.canaries.updates().astype(np.float64)
        zero = np.zeros(out.shape[1])
        for row in out:  # canary k's model is w + c_k: its update c_k through clip_model_update, in place
            params = [row]
            clip_model_update(params, [zero], self.clipping_norm, self.clips_before_noise)
            row[:] = params[0]
        return out

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        checked = self.check(server_round, replies)
        ok = checked.valid_by_client()
        current = to_numpy(self.current_arrays)
        norms = {c: clip_reply_update(checked.reply_of[c], current, self.clipping_norm, clip=self.clips_before_noise)
                 for c in checked.contributors}
        m = len(checked.contributors)
        info = {"m": m, "rejected": len(checked.rejected), "update_norms": norms,
                "clipped": sum(v > self.clipping_norm for v in norms.values())}
        self.rounds[server_round] = info
        arrays, metrics = self.strategy.aggregate_train(server_round, ok)
        if arrays is None or m == 0:
            return None, metrics
        agg = to_numpy(arrays)
        k_in = 0
        if self.canaries is not None:  # canaries join the weighted mean and the cohort before the noise
            w_real = real_weight(ok, self.weight_key)
            agg = mix_into_weighted_mean(agg, current, w_real, self.clipped_canary_updates(), self.canaries.weights)
            k_in = self.canaries.num_inserted
        cohort = (m + k_in) * (WRONG_COHORT_FACTOR if self.fault == "wrong-cohort" else 1)
        sigma = flower_stdv(self.noise_multiplier, self.clipping_norm, cohort)
        noise = gaussian_noise_like(list(agg.values()), sigma / noise_divisor(self.fault), self.rng)
        info["sigma"] = sigma  # what the mechanism reports (and the ledger uses)
        if self.canaries is not None:
            total = w_real + float(self.canaries.weights.sum())
            info.update(canaries=k_in, canary_signal_over_sigma=self.canaries.signal_over_sigma(total, sigma))
        released = OrderedDict((k, v + z) for (k, v), z in zip(agg.items(), noise))
        if self.fault == "clip-after-noise":  # the bug: the round's noised update projected onto the C-ball
            keys = float_keys(released)
            params = [released[k] for k in keys]
            clip_model_update(params, [current[k] for k in keys], self.clipping_norm)
            released.update(zip(keys, params))
        return from_numpy(released), metrics
