"""Flower's built-in FedAvg, FedProx and FedAdam for the ultrasound study, with a fixed full cohort.

The algorithms are Flower's (``flwr.serverapp.strategy``); this module only adds:

* :class:`FixedCohort` (mixin): full participation of K logical clients. Each round sends one
  message per logical client, carrying its ``client-id`` in the train config, to the node that
  plays it: client k -> the k-th node (sorted ids) modulo the number of nodes, so K clients run on
  K SuperNodes (as in the paper) or share fewer (a laptop's default local federation). Nodes beyond
  the K needed are not asked. Every reply's MetricRecord is kept per round (per-client timing, DP
  ledgers); an error reply or a missing client fails the round loudly (full participation is the
  protocol).
* :class:`BufferAveragingFedAdam`: FedAdam's adaptive server step is meant for
  parameters; applied to BatchNorm running statistics it can drive a running variance
  negative. Buffers (``buffer_keys``) therefore take the plain weighted mean (FedAvg)
  while parameters take Flower's FedAdam step.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdam, FedAvg, FedProx
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

CLIENT_ID_KEY = "client-id"


def client_node_map(node_ids: Iterable[int], num_clients: int) -> dict[int, int]:
    """Logical client k -> the k-th node (sorted ids) modulo the number of nodes."""
    nodes = sorted(node_ids)
    if not nodes:
        raise RuntimeError("no SuperNodes are connected")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    return {k: nodes[k % len(nodes)] for k in range(num_clients)}


def client_of(config: ConfigRecord) -> int:
    """The logical client a train message is for (its config's ``client-id``)."""
    if CLIENT_ID_KEY not in config:
        raise KeyError(f"train message without {CLIENT_ID_KEY!r} in its config")
    return int(config[CLIENT_ID_KEY])


def client_messages(client_nodes: dict[int, int], arrays: ArrayRecord, config: ConfigRecord, message_type: str,
                    arrays_key: str = "arrays", config_key: str = "config") -> list[Message]:
    """One message per logical client: the shared ``arrays`` and a copy of ``config`` with its ``client-id``."""
    msgs = []
    for k, node in sorted(client_nodes.items()):
        conf = ConfigRecord(dict(config))
        conf[CLIENT_ID_KEY] = k
        msgs.append(Message(RecordDict({arrays_key: arrays, config_key: conf}), dst_node_id=node,
                            message_type=message_type))
    return msgs


class FixedCohort:
    """Mixin for a Flower FedAvg-family strategy: a fixed full cohort and per-client reply metrics."""

    client_nodes: dict[int, int]
    client_metrics: dict[int, list[dict]]

    def set_cohort(self, client_nodes: dict[int, int], action: str) -> None:
        """Train exactly these logical clients (client -> node), with messages of type ``train.<action>``."""
        self.client_nodes = dict(client_nodes)
        self.action = action
        self.client_metrics = {}
        n = len(set(client_nodes.values()))
        self.min_train_nodes = self.min_available_nodes = n  # type: ignore[attr-defined]

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        # Flower's strategy builds the round's content (server-round, FedProx's proximal-mu, ...); the
        # messages are then one per logical client. Flower sends plain "train"; the project's ClientApp
        # routes "train.<action>".
        msgs = list(super().configure_train(server_round, arrays, config, grid))  # type: ignore[misc]
        if not msgs:
            return []
        content = msgs[0].content
        akey, ckey = self.arrayrecord_key, self.configrecord_key  # type: ignore[attr-defined]
        return client_messages(self.client_nodes, content[akey], content[ckey], f"{MessageType.TRAIN}.{self.action}",
                               akey, ckey)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        bad = [m for m in replies if m.has_error()]
        if bad or len(replies) < len(self.client_nodes):
            # Full participation is the protocol: a lost client is a failed run, not a smaller average.
            reason = bad[0].error.reason if bad else "no reply before the timeout"
            raise RuntimeError(f"round {server_round}: {len(replies) - len(bad)}/{len(self.client_nodes)} clients "
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
