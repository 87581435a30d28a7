"""FL No-DP: FedAvg with equal client weights (seed paper, Sec. 3.3).

Every logical client trains from w(t); w(t+1) is the unweighted mean of the client models.
The example-weighted variant (strategies.fedavg_examples) overrides ``client_weights`` and ``combine``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from strategies.base import LogicalClientStrategy
from strategies.records import client_arrays, from_numpy, number, to_numpy

log = logging.getLogger(__name__)


def equal_weight_mean(models: list[OrderedDict[str, np.ndarray]]) -> OrderedDict[str, np.ndarray]:
    """Element-wise mean of models with equal weights (accumulated in float64)."""
    if not models:
        raise ValueError("cannot average zero models")
    keys = list(models[0])
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    for k in keys:
        acc = np.zeros(models[0][k].shape, dtype=np.float64)
        for m in models:
            acc += m[k]
        out[k] = (acc / len(models)).astype(models[0][k].dtype)
    return out


class EqualWeightFedAvg(LogicalClientStrategy):
    """FedAvg over logical clients with equal weights, Message API.

    Parameters
    ----------
    client_ids : the logical clients (every round's cohort, or the population a sampler draws from).
    action : ClientApp action that trains them (message type ``train.<action>``).
    clients_per_message : logical clients packed in one message (transport only).
    """

    array_claims = "each"  # a reply carries one model per client its message asked for
    required_metrics = frozenset({"num-examples", "train-loss"})  # the round's train-loss is their weighted mean

    def summary(self) -> None:
        log.info("EqualWeightFedAvg: %d clients, %d per message", len(self.client_ids), self.clients_per_message)

    def client_weights(self, reply: Message, clients: list[int]) -> dict[int, float]:
        """Weight of each client a valid ``reply`` speaks for: 1 each (the seed paper's unweighted mean)."""
        return dict.fromkeys(clients, 1.0)

    def combine(self, models: list[OrderedDict[str, np.ndarray]], weights: list[float]) -> OrderedDict[str, np.ndarray]:
        """The round's aggregate of the contributors' models (ordered by client id); weights are all 1 here."""
        return equal_weight_mean(models)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        # Only replies that speak for exactly the clients their message asked for count.
        checked = self.check(server_round, replies)
        models: dict[int, OrderedDict[str, np.ndarray]] = {}
        weights: dict[int, float] = {}
        losses = []
        for reply in checked.valid:
            arrays = client_arrays(reply)
            for cid, rec in arrays.items():
                models[cid] = to_numpy(rec)
            weights.update(self.client_weights(reply, sorted(arrays)))
            m = reply.content["metrics"]
            losses.append((float(number(m["train-loss"])), int(number(m["num-examples"]))))
        expected = len(self.cohort)  # the round's planned clients (all of them without sampling)
        if not models:
            if expected:
                log.warning("round %d: no client replied; the model is unchanged", server_round)
            return None, self.cohort_metrics(MetricRecord({"num-contributors": 0, "num-failed": expected}))
        order = sorted(models)
        agg = self.combine([models[c] for c in order], [weights[c] for c in order])
        n_ex = sum(n for _, n in losses)
        metrics = MetricRecord(
            {
                "num-contributors": len(models),
                "num-failed": expected - len(models),
                "train-loss": sum(loss * n for loss, n in losses) / max(n_ex, 1),
            }
        )
        return from_numpy(agg), self.cohort_metrics(metrics)
