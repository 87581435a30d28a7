"""tabular-pdp's aggregation: Flower's FedAvg (size-weighted) over the fixed cohort, pooled test errors.

Training is FedAvg's own ``aggregate_train`` over one ``train.tabular_pdp`` message per logical
client (strategies.fixed_cohort), so the server-side DP wrappers compose with it. Evaluation sends
``evaluate.tabular_pdp`` messages (the ClientApp's ``evaluate`` handler), whose replies carry error
sums, pooled here over every test example.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from strategies.cohorts import check_replies
from strategies.fixed_cohort import FixedCohort
from strategies.records import number

log = logging.getLogger(__name__)


class CohortFedAvg(FixedCohort, FedAvg):
    """Size-weighted FedAvg over ``client_ids`` (full participation; :meth:`exclude` removes some)."""

    def __init__(self, client_ids: list[int], action: str, placement: dict[int, int] | None = None) -> None:
        FedAvg.__init__(self, min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1)
        self.set_cohort(client_ids, action, placement)
        self.per_client_eval: dict[int, dict[str, float]] = {}
        self._eval_sent: list[Message] = []

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self.cohort_messages(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        self._eval_sent = self.cohort_messages(server_round, arrays, config, grid, remember=False,
                                               kind=MessageType.EVALUATE)
        return self._eval_sent

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Pooled MAE, MRE and RMSE over every test example of the replying clients."""
        # An evaluation reply carries error sums, no model: the fit rules without the model and the committed sizes.
        rules = replace(self.reply_rules_in_force(), returns_model=False, metric_keys=None, committed_examples=None,
                        max_examples_of=None)
        checked = check_replies(self._eval_sent, replies, self.array_claims, rules)
        for cid, why in sorted(checked.problem_of.items()):
            log.warning("round %d: no evaluation from client %d: %s", server_round, cid, why)
        if not checked.contributors:
            return None
        sums: dict[str, float] = {"abs-err-sum": 0.0, "rel-err-sum": 0.0, "sq-err-sum": 0.0, "num-examples": 0}
        self.per_client_eval = {}
        for cid in checked.contributors:
            m = checked.reply_of[cid].content["metrics"]
            n: float = int(number(m["num-examples"]))  # an int; float: n is also the pooled count below
            self.per_client_eval[cid] = {"mae": float(number(m["abs-err-sum"])) / n,
                                         "mre": float(number(m["rel-err-sum"])) / n, "n": n}
            for k in sums:
                sums[k] += number(m[k])
        n = sums["num-examples"]
        return MetricRecord({"test-mae": sums["abs-err-sum"] / n, "test-mre": sums["rel-err-sum"] / n,
                             "test-rmse": (sums["sq-err-sum"] / n) ** 0.5, "num-examples": n})
