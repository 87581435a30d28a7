"""A fixed cohort of logical clients for any of Flower's FedAvg-family strategies (mixin).

Flower's ``FedAvg``/``FedProx``/``FedAdam`` sample SuperNodes and send plain ``train``
messages. The studies address *logical clients* (strategies.cohorts): one ``train.<action>``
message per client, carrying ``client-ids = [k]``, client k played by the k-th node (sorted
ids) modulo the number of nodes, or the node that holds its data (``placement``, node-local
deployments). This mixin changes only that addressing; the algorithm's
own ``configure_train`` still builds the round's content (``server-round``, FedProx's
``proximal-mu``, ...) and its own ``aggregate_train`` aggregates.

Replies are checked against the plan (strategies.cohorts.check_replies): a reply that speaks
for another client, or for more clients than asked, is dropped and counted as failed; the
valid ones go to the algorithm sorted by client id, so float sums do not depend on arrival
order. Per-client reply metrics and the contributors of each round are kept.

Use: ``class CohortFedAvg(FixedCohort, FedAvg)``; then ``strategy.set_cohort(ids, action)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid

from strategies.cohorts import CheckedReplies, PlanChecked, build_messages, plan_cohorts


class FixedCohort(PlanChecked):
    """Mixin (first base) for a Flower FedAvg-family strategy: full participation of named clients."""

    array_claims = "none"  # one model per reply, under the strategy's ``arrayrecord_key``
    placement: dict[int, int] | None = None  # logical client -> its node (node-local data); None: round-robin

    @property
    def weight_key(self) -> str:
        """FedAvg weights each reply by its ``weighted_by_key`` metric (strategies.layer's protocol)."""
        return str(self.weighted_by_key)  # type: ignore[attr-defined]

    def set_cohort(self, client_ids: Iterable[int], action: str, placement: dict[int, int] | None = None) -> None:
        """Train exactly these logical clients, with messages of type ``train.<action>``.

        ``placement``: logical client -> the node holding its data (node-local deployments), else None.
        """
        ids = sorted(int(c) for c in client_ids)
        if not ids:
            raise ValueError("a cohort needs at least one client")
        self.client_ids = ids
        self.action = action
        self.placement = None if placement is None else dict(placement)
        self.contributors: dict[int, list[int]] = {}
        self.client_metrics: dict[int, dict[int, dict]] = {}
        self.last_checked = CheckedReplies()
        self.min_train_nodes = self.min_available_nodes = 1  # the cohort, not node sampling, decides

    def state(self) -> dict[str, Any]:
        """The layer's records, who contributed each round, and the cohort (a drift re-check may have shrunk it)."""
        return {**super().state(), "contributors": json.dumps({str(r): list(c) for r, c in self.contributors.items()}),
                "client_ids": json.dumps(self.client_ids)}

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self.contributors = {int(r): list(c) for r, c in json.loads(state["contributors"]).items()}
        self.client_ids = [int(c) for c in json.loads(state["client_ids"])]

    def exclude(self, client_ids: Iterable[int]) -> None:
        """Stop sending to these clients from the next round on."""
        drop = {int(c) for c in client_ids}
        self.client_ids = [c for c in self.client_ids if c not in drop]
        if not self.client_ids:
            raise RuntimeError("every client has been excluded")

    def cohort_messages(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                        remember: bool = True, kind: str = MessageType.TRAIN) -> list[Message]:
        """One ``<kind>.<action>`` message per logical client of the cohort, all carrying ``arrays`` and ``config``."""
        akey, ckey = self.arrayrecord_key, self.configrecord_key  # type: ignore[attr-defined]
        config = ConfigRecord(dict(config))
        config["server-round"] = server_round
        plan = plan_cohorts(self.client_ids, list(grid.get_node_ids()), 1, self.placement)
        msgs = build_messages(plan, arrays, config, self.action, kind, arrays_key=akey, config_key=ckey)
        return self.remember(msgs) if remember else msgs

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        # Flower's strategy builds the round's content (server-round, FedProx's proximal-mu, ...).
        built = list(super().configure_train(server_round, arrays, config, grid))  # type: ignore[misc]
        if not built:
            return []
        akey, ckey = self.arrayrecord_key, self.configrecord_key  # type: ignore[attr-defined]
        return self.cohort_messages(server_round, built[0].content[akey], built[0].content[ckey], grid)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        checked = self.checked_train(server_round, replies)
        return super().aggregate_train(server_round, checked.valid_by_client())  # type: ignore[misc]

    def checked_train(self, server_round: int, replies: Iterable[Message]) -> CheckedReplies:
        """Check a train round's replies and record who contributed (what aggregate_train does first)."""
        checked = self.check(server_round, replies)
        self.last_checked = checked
        self.contributors[server_round] = checked.contributors  # client_metrics: kept by PlanChecked.check
        return checked
