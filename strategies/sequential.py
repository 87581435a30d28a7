"""Sequential (token-passing) decentralized FL, emulated as a chained Flower strategy.

Seed paper, Sec. 3.3: one model visits all N clients in a fixed order each round; client
i trains the model it received from client i-1. The ServerApp only relays the token:
it sends w(t) to client 1, forwards client 1's result to client 2, and so on. It never
aggregates. The round's result is the token after the last client.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp import Grid

from strategies.base import LogicalClientStrategy
from strategies.cohorts import check_replies
from strategies.records import client_arrays, int_list, number
from strategies.reply_rules import DEFAULT_RULES, ReplyRules
from strategies.transport import send_and_receive

log = logging.getLogger(__name__)


class RelayGrid:
    """Grid view that sends a round's messages one at a time, passing the token along.

    Message k+1 carries the ArrayRecord returned for message k. A message that fails
    (error reply, timeout, or a reply that claims other clients than the hop asked for, see
    strategies.cohorts.check_replies) is skipped: the token goes on unchanged to the next
    client, so one dead or lying node does not end the round.
    """

    def __init__(self, grid: Grid, rules: ReplyRules = DEFAULT_RULES) -> None:
        self._grid = grid
        self.rules = rules  # strategies.reply_rules: a hop's token must be shaped like the token it was sent

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        token: ArrayRecord | None = None
        replies: list[Message] = []
        for msg in messages:
            if token is not None:
                # The strategy's own message object travels (so its id matches the plan).
                msg.content["arrays"] = token
            checked = check_replies([msg], send_and_receive(self._grid, [msg], timeout=timeout), "last",
                                     self.rules)
            clients = list(int_list(msg.content["config"]["client-ids"]))
            if checked.valid:
                token = next(iter(client_arrays(checked.valid[0]).values()))
                replies.append(checked.valid[0])
            else:
                reason = (checked.failed[0].error.reason if checked.failed else
                          checked.rejected[0] if checked.rejected else "no reply before timeout")
                log.warning("chain hop to node %s (clients %s) failed: %s; passing the token on",
                            msg.metadata.dst_node_id, clients, reason)
                replies.extend(checked.failed)
        return replies


class SequentialDFL(LogicalClientStrategy):
    """Token passing through ``client_ids`` in that fixed order every round (the sampled ones, with a sampler)."""

    array_claims = "last"  # a hop's reply carries one token, under the hop's last client
    required_metrics = frozenset({"num-examples", "train-loss"})  # the round's train-loss is their weighted mean

    def summary(self) -> None:
        log.info("SequentialDFL: chain of %d clients, %d per message", len(self.client_ids), self.clients_per_message)

    def prepare_grid(self, grid: Grid) -> Grid:
        return RelayGrid(grid, self.reply_rules_in_force())  # type: ignore[return-value]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        checked = self.check(server_round, replies)
        ok = checked.valid  # in chain order: the relay returns hops as they happened
        visited = checked.contributors
        loss_sum, n_ex = 0.0, 0
        for reply in ok:
            m = reply.content["metrics"]
            loss_sum += float(number(m["train-loss"])) * int(number(m["num-examples"]))
            n_ex += int(number(m["num-examples"]))
        if not ok:
            if self.cohort:
                log.warning("round %d: every hop failed; the model is unchanged", server_round)
            return None, self.cohort_metrics(MetricRecord({"num-contributors": 0, "num-failed": len(self.cohort)}))
        token = next(iter(client_arrays(ok[-1]).values()))
        return token, self.cohort_metrics(MetricRecord(
            {
                "num-contributors": len(visited),
                "num-failed": len(self.cohort) - len(visited),
                "train-loss": loss_sum / max(n_ex, 1),
            }
        ))
