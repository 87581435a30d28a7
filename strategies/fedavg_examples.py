"""FedAvg weighted by examples over logical clients (McMahan et al., AISTATS 2017, Algorithm 1).

w(t+1) = sum_k n_k w_k / sum_k n_k, with n_k the ``num-examples`` client k reports in its reply
(strategies.records). The count is hostile input like the rest of the reply: the plan check
(strategies.cohorts.check_replies with the study's strategies.reply_rules.ReplyRules) refuses a
reply whose ``num-examples`` is not an integer in [1, the client's bound] or differs from the size
the client committed, before any weight is taken from it. Give the tightest bound the server knows
(``committed_examples`` or ``max_examples_of``): within it a client still chooses its own weight.

Each reply must speak for one client: a reply for several packed clients reports their summed
count, from which no per-client weight follows.

No DP variant: ``MatchedPerturbation`` sizes sigma_abs for the mean of N equal-weight members
(sensitivity C / N, seed paper Algorithm 1); a weighted mean's sensitivity is C max_k n_k / sum_k n_k,
and with reported counts it depends on the clients' claims. Both DP wrappers and the audit
canaries refuse a strategy whose ``member_weights`` is not "equal".
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
from flwr.app import Message

from strategies.fedavg_equal import EqualWeightFedAvg
from strategies.records import number

log = logging.getLogger(__name__)


def example_weighted_mean(models: list[OrderedDict[str, np.ndarray]],
                          weights: list[float]) -> OrderedDict[str, np.ndarray]:
    """Element-wise sum_k n_k m_k / sum_k n_k (accumulated in float64), every key kept in its dtype."""
    if not models:
        raise ValueError("cannot average zero models")
    if len(weights) != len(models):
        raise ValueError(f"{len(models)} models but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if not (np.isfinite(w).all() and (w > 0).all()):
        raise ValueError(f"weights must be finite and > 0, got {weights}")
    total = float(w.sum())
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    for k in models[0]:
        acc = np.zeros(models[0][k].shape, dtype=np.float64)
        for n, m in zip(w, models):
            acc += n * m[k].astype(np.float64)
        out[k] = (acc / total).astype(models[0][k].dtype)
    return out


class ExampleWeightedFedAvg(EqualWeightFedAvg):
    """FedAvg over logical clients, each weighted by the ``num-examples`` of its reply (see module doc).

    Same round, reply check, failure handling and metrics as :class:`EqualWeightFedAvg`; only the
    weights differ. ``clients_per_message`` must be 1.
    """

    member_weights = "examples"

    def __init__(self, client_ids: list[int], action: str, clients_per_message: int = 1) -> None:
        if clients_per_message != 1:
            raise ValueError(f"ExampleWeightedFedAvg needs clients_per_message = 1, got {clients_per_message}: a "
                             "reply for several clients reports their summed num-examples, not one per client")
        super().__init__(client_ids, action, clients_per_message)

    def summary(self) -> None:
        log.info("ExampleWeightedFedAvg: %d clients, weighted by num-examples", len(self.client_ids))

    def client_weights(self, reply: Message, clients: list[int]) -> dict[int, float]:
        # One client per reply (see __init__); num-examples is in range: the plan check refused it otherwise.
        (cid,) = clients
        return {cid: float(int(number(reply.content["metrics"]["num-examples"])))}

    def combine(self, models: list[OrderedDict[str, np.ndarray]], weights: list[float]) -> OrderedDict[str, np.ndarray]:
        return example_weighted_mean(models, weights)
