"""Which node plays which logical clients, and how messages are built for them."""

from __future__ import annotations

import json

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid


def plan_cohorts(client_ids: list[int], node_ids: list[int], clients_per_message: int) -> list[tuple[int, list[int]]]:
    """Pack logical clients, in order, into messages of ``clients_per_message`` clients.

    Message j goes to node ``node_ids[j % len(node_ids)]`` (sorted ids, so the mapping is
    reproducible). With one client per message and as many nodes as clients, every logical
    client is its own SuperNode, as in the paper; packing several clients into one message
    is a transport optimisation (fewer messages) that leaves the math unchanged.
    """
    if clients_per_message < 1:
        raise ValueError(f"clients_per_message must be >= 1, got {clients_per_message}")
    if not node_ids:
        raise ValueError("no SuperNodes are connected")
    nodes = sorted(node_ids)
    chunks = [client_ids[i : i + clients_per_message] for i in range(0, len(client_ids), clients_per_message)]
    return [(nodes[j % len(nodes)], chunk) for j, chunk in enumerate(chunks)]


def wait_for_nodes(grid: Grid, minimum: int, timeout: float = 120.0) -> list[int]:
    """Node ids once at least ``minimum`` are connected (deployments connect gradually)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= minimum or time.monotonic() > deadline:
            if len(nodes) < minimum:
                raise RuntimeError(f"only {len(nodes)} SuperNodes connected after {timeout:.0f}s, need {minimum}")
            return nodes
        time.sleep(0.5)


def build_train_messages(
    plan: list[tuple[int, list[int]]], arrays: ArrayRecord, config: ConfigRecord, action: str
) -> list[Message]:
    """One train message per (node, clients) entry, all carrying ``arrays`` and ``config``."""
    messages = []
    for node_id, clients in plan:
        cfg = ConfigRecord(dict(config))
        cfg["client-ids"] = list(clients)
        messages.append(
            Message(
                content=RecordDict({"arrays": arrays, "config": cfg}),
                message_type=f"{MessageType.TRAIN}.{action}",
                dst_node_id=node_id,
            )
        )
    return messages


def config_record(run_config: dict) -> ConfigRecord:
    """The study's resolved config, serialized once for every message."""
    return ConfigRecord({"run-config": json.dumps(run_config, sort_keys=True)})
