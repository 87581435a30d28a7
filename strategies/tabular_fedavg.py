"""FedAvg over named logical clients (Flower's FedAvg, size-weighted), with federated test errors.

Flower's ``FedAvg`` samples nodes and sends plain ``train`` messages; the studies address
logical clients through ``train.<action>`` messages (strategies.records). This subclass
changes only how messages are built (``configure_train`` / ``configure_evaluate``) and how
test errors are pooled (``aggregate_evaluate``); aggregation is FedAvg's own
``aggregate_train`` (weighted by ``num-examples``), so Flower's DP wrappers compose with it.

Replies carry one ArrayRecord ``arrays``, one MetricRecord ``metrics`` (``num-examples``,
``train-loss``) and a ConfigRecord ``info`` with ``client-id``. Evaluation goes through the
same ``train.<action>`` handler with ``phase = evaluate`` (the router registers one action per
study) and replies with error sums, pooled over every test example.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from strategies.cohorts import build_train_messages, plan_cohorts

log = logging.getLogger(__name__)


def reply_client_id(reply: Message) -> int:
    """The logical client a reply speaks for."""
    return int(reply.content["info"]["client-id"])


class ClientFedAvg(FedAvg):
    """Size-weighted FedAvg over ``client_ids`` (one logical client per message).

    Parameters
    ----------
    client_ids : logical clients taking part (full participation); :meth:`exclude` removes some.
    action : ClientApp action (message type ``train.<action>``).
    """

    def __init__(self, client_ids: list[int], action: str) -> None:
        super().__init__(min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1)
        if not client_ids:
            raise ValueError("ClientFedAvg needs at least one client")
        self.client_ids = sorted(int(c) for c in client_ids)
        self.action = action
        self.per_client_eval: dict[int, dict[str, float]] = {}
        self.contributors: dict[int, list[int]] = {}

    def exclude(self, client_ids: Iterable[int]) -> None:
        """Stop sending to these clients from the next round on."""
        drop = set(int(c) for c in client_ids)
        self.client_ids = [c for c in self.client_ids if c not in drop]
        if not self.client_ids:
            raise RuntimeError("every client has been excluded")

    def _messages(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                  phase: str) -> list[Message]:
        cfg = ConfigRecord(dict(config))
        cfg["server-round"] = server_round
        cfg["phase"] = phase
        plan = plan_cohorts(self.client_ids, list(grid.get_node_ids()), 1)
        return build_train_messages(plan, arrays, cfg, self.action)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self._messages(server_round, arrays, config, grid, "fit")

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        # Sorted by client id: the weighted sum (float) does not depend on the order replies arrived in.
        replies = sorted(replies, key=lambda r: (r.has_error(), -1 if r.has_error() else reply_client_id(r)))
        self.contributors[server_round] = [reply_client_id(r) for r in replies if not r.has_error()]
        return super().aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self._messages(server_round, arrays, config, grid, "evaluate")

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Pooled MAE, MRE and RMSE over every test example of the replying clients."""
        replies = list(replies)
        ok = sorted((r for r in replies if not r.has_error()), key=reply_client_id)
        for r in replies:
            if r.has_error():
                log.warning("round %d: evaluation error from node %s: %s", server_round, r.metadata.src_node_id,
                            r.error.reason)
        if not ok:
            return None
        sums = {"abs-err-sum": 0.0, "rel-err-sum": 0.0, "sq-err-sum": 0.0, "num-examples": 0}
        self.per_client_eval = {}
        for r in ok:
            m = r.content["metrics"]
            n = int(m["num-examples"])
            self.per_client_eval[reply_client_id(r)] = {"mae": float(m["abs-err-sum"]) / n,
                                                        "mre": float(m["rel-err-sum"]) / n, "n": n}
            for k in sums:
                sums[k] += m[k]
        n = sums["num-examples"]
        return MetricRecord({"test-mae": sums["abs-err-sum"] / n, "test-mre": sums["rel-err-sum"] / n,
                             "test-rmse": (sums["sq-err-sum"] / n) ** 0.5, "num-examples": n})
