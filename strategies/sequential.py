"""Sequential (token-passing) decentralized FL, emulated as a chained Flower strategy.

Seed paper, Sec. 3.3: one model visits all N clients in a fixed order each round; client
i trains the model it received from client i-1. The ServerApp only relays the token:
it sends w(t) to client 1, forwards client 1's result to client 2, and so on. It never
aggregates. The round's result is the token after the last client.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from strategies.base import PatternStrategy
from strategies.cohorts import build_train_messages, plan_cohorts
from strategies.records import client_arrays, valid_replies
from strategies.transport import send_and_receive

log = logging.getLogger(__name__)


class RelayGrid:
    """Grid view that sends a round's messages one at a time, passing the token along.

    Message k+1 carries the ArrayRecord returned for message k. A message that fails
    (error reply or timeout) is recorded and skipped: the token goes on unchanged to the
    next client, so one dead node does not end the round.
    """

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        self.hops: list[dict] = []

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        token: ArrayRecord | None = None
        replies: list[Message] = []
        self.hops = []
        for msg in messages:
            if token is not None:
                msg = Message(
                    content=RecordDict({"arrays": token, "config": msg.content["config"]}),
                    message_type=msg.metadata.message_type,
                    dst_node_id=msg.metadata.dst_node_id,
                )
            got = send_and_receive(self._grid, [msg], timeout=timeout)
            clients = list(msg.content["config"]["client-ids"])
            if got and not got[0].has_error():
                arrays = client_arrays(got[0])
                if len(arrays) != 1:
                    raise ValueError(f"a chain reply must carry exactly one token, got {sorted(arrays)}")
                token = next(iter(arrays.values()))
                replies.append(got[0])
                self.hops.append({"node": msg.metadata.dst_node_id, "clients": clients, "ok": True})
            else:
                reason = got[0].error.reason if got else "no reply before timeout"
                log.warning("chain hop to node %s (clients %s) failed: %s; passing the token on",
                            msg.metadata.dst_node_id, clients, reason)
                self.hops.append({"node": msg.metadata.dst_node_id, "clients": clients, "ok": False,
                                  "reason": str(reason)})
                if got:
                    replies.append(got[0])
        return replies


class SequentialDFL(PatternStrategy):
    """Token passing through ``client_ids`` in that fixed order every round."""

    def __init__(self, client_ids: list[int], action: str, clients_per_message: int = 1) -> None:
        self.client_ids = list(client_ids)
        self.action = action
        self.clients_per_message = clients_per_message
        self.last_round: dict = {}

    def summary(self) -> None:
        log.info("SequentialDFL: chain of %d clients, %d per message", len(self.client_ids), self.clients_per_message)

    def prepare_grid(self, grid: Grid) -> Grid:
        return RelayGrid(grid)  # type: ignore[return-value]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config["server-round"] = server_round
        plan = plan_cohorts(self.client_ids, list(grid.get_node_ids()), self.clients_per_message)
        return build_train_messages(plan, arrays, config, self.action)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        ok, _ = valid_replies(list(replies))
        visited: list[int] = []
        loss_sum, n_ex = 0.0, 0
        for reply in ok:
            m = reply.content["metrics"]
            visited += [int(c) for c in m["client-ids"]]
            loss_sum += float(m["train-loss"]) * int(m["num-examples"])
            n_ex += int(m["num-examples"])
        self.last_round = {"contributors": visited}
        if not ok:
            log.warning("round %d: every hop failed; the model is unchanged", server_round)
            return None, MetricRecord({"num-contributors": 0, "num-failed": len(self.client_ids)})
        token = next(iter(client_arrays(ok[-1]).values()))
        return token, MetricRecord(
            {
                "num-contributors": len(visited),
                "num-failed": len(self.client_ids) - len(visited),
                "train-loss": loss_sum / max(n_ex, 1),
            }
        )
