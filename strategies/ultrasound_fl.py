"""Flower's built-in FedAvg, FedProx and FedAdam for the ultrasound study, with a fixed full cohort.

The algorithms are Flower's (``flwr.serverapp.strategy``); this module only adds:

* :class:`FixedCohort` (mixin): full participation of K logical clients, one per node, via
  a node -> client map carried in the train config (``node-clients``), so a client
  learns who it is from the message; nodes beyond the K mapped ones are not asked.
  Every reply's MetricRecord is kept per round (per-client timing, DP ledgers); an error
  reply or a missing client fails the round loudly (full participation is the protocol).
* :class:`BufferAveragingFedAdam`: FedAdam's adaptive server step is meant for
  parameters; applied to BatchNorm running statistics it can drive a running variance
  negative. Buffers (``buffer_keys``) therefore take the plain weighted mean (FedAvg)
  while parameters take Flower's FedAdam step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdam, FedAvg, FedProx
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

NODE_CLIENTS_KEY = "node-clients"


def node_client_map(node_ids: Iterable[int], num_clients: int) -> dict[int, int]:
    """The first ``num_clients`` node ids (sorted) -> logical clients 0..K-1."""
    nodes = sorted(node_ids)
    if len(nodes) < num_clients:
        raise RuntimeError(f"{len(nodes)} SuperNodes connected, the study needs one per client (K = {num_clients})")
    return {n: k for k, n in enumerate(nodes[:num_clients])}


def client_of(config: ConfigRecord, node_id: int) -> int:
    """The logical client a node plays, from a message's config."""
    mapping = json.loads(str(config[NODE_CLIENTS_KEY]))
    if str(node_id) not in mapping:
        raise KeyError(f"node {node_id} has no client in this message's {NODE_CLIENTS_KEY} map")
    return int(mapping[str(node_id)])


class FixedCohort:
    """Mixin for a Flower FedAvg-family strategy: a fixed full cohort and per-client reply metrics."""

    node_clients: dict[int, int]
    client_metrics: dict[int, list[dict]]

    def set_cohort(self, node_clients: dict[int, int], action: str) -> None:
        """Ask exactly these nodes (node id -> logical client), with messages of type ``train.<action>``."""
        self.node_clients = dict(node_clients)
        self.action = action
        self.client_metrics = {}
        n = len(node_clients)
        self.min_train_nodes = self.min_available_nodes = n  # type: ignore[attr-defined]

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config[NODE_CLIENTS_KEY] = json.dumps({str(n): k for n, k in self.node_clients.items()})
        msgs = super().configure_train(server_round, arrays, config, grid)  # type: ignore[misc]
        # Flower's strategies send plain "train"; the project's ClientApp routes "train.<action>".
        kind = f"{MessageType.TRAIN}.{self.action}"
        return [Message(m.content, dst_node_id=m.metadata.dst_node_id, message_type=kind)
                for m in msgs if m.metadata.dst_node_id in self.node_clients]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        bad = [m for m in replies if m.has_error()]
        if bad or len(replies) < len(self.node_clients):
            # Full participation is the protocol: a lost client is a failed run, not a smaller average.
            reason = bad[0].error.reason if bad else "no reply before the timeout"
            raise RuntimeError(f"round {server_round}: {len(replies) - len(bad)}/{len(self.node_clients)} clients "
                               f"replied ({len(bad)} errors); first problem: {reason}")
        self.client_metrics[server_round] = [dict(m.content["metrics"]) for m in replies]
        return super().aggregate_train(server_round, replies)  # type: ignore[misc]


class BufferAveragingFedAdam(FedAdam):
    """Flower's FedAdam on parameters; plain weighted mean on ``buffer_keys`` (e.g. BN running stats)."""

    def __init__(self, *args, buffer_keys: Iterable[str] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.buffer_keys = frozenset(buffer_keys)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or not self.buffer_keys:
            return arrays, metrics
        ok = [m.content for m in replies if not m.has_error()]
        mean = aggregate_arrayrecords(ok, self.weighted_by_key)
        out = {k: (Array(mean[k].numpy()) if k in self.buffer_keys else v) for k, v in arrays.items()}
        return ArrayRecord(out), metrics


class UsFedAvg(FixedCohort, FedAvg):
    """FedAvg (McMahan et al. 2017) over the fixed cohort."""


class UsFedProx(FixedCohort, FedProx):
    """FedProx (Li et al. 2020): Flower transports ``proximal-mu``; the client adds mu/2 ||w - w_t||^2."""


class UsFedAdam(FixedCohort, BufferAveragingFedAdam):
    """FedAdam (Reddi et al. 2021) over the fixed cohort."""


def build_ultrasound_strategy(algorithm: str, *, proximal_mu: float = 0.01, server_lr: float = 0.01,
                              beta1: float = 0.9, beta2: float = 0.99, buffer_keys: Iterable[str] = ()) -> FedAvg:
    """'fedavg' | 'fedprox' | 'fedadam' with the paper's settings; no federated evaluation round."""
    common = {"fraction_train": 1.0, "fraction_evaluate": 0.0}
    if algorithm == "fedavg":
        return UsFedAvg(**common)
    if algorithm == "fedprox":
        return UsFedProx(**common, proximal_mu=proximal_mu)
    if algorithm == "fedadam":
        # eta_l is Flower's record of the client lr; the clients use their own Adam lr.
        return UsFedAdam(**common, eta=server_lr, beta_1=beta1, beta_2=beta2, buffer_keys=buffer_keys)
    raise ValueError(f"unknown algorithm {algorithm!r}; allowed: ['fedadam', 'fedavg', 'fedprox']")
