"""Flower's built-in FedAvg, FedProx and FedAdam for the ultrasound study, over a fixed full cohort.

The algorithms are Flower's (``flwr.serverapp.strategy``); strategies.fixed_cohort addresses the
K logical clients (one message each; client k on the k-th node modulo the number of nodes, so K
clients run on K SuperNodes as in the paper or share fewer). Full participation is the paper's
protocol: a lost or rejected client fails the round loudly instead of shrinking the average.
FedAdam averages buffers instead of Adam-stepping them (strategies.fedadam_buffers). An array that every
client returns unchanged (a frozen backbone under DP-SGD) aggregates to itself exactly (strategies.exact_mean).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg, FedProx

from strategies.exact_mean import ExactConsensusMean
from strategies.fedadam_buffers import BufferAveragingFedAdam
from strategies.fixed_cohort import FixedCohort
from strategies.records import number
from strategies.reply_rules import ReplyRules

#: The metrics of a federated train reply (client_app.train), and nothing else: Flower's FedAvg family
#: needs the same metric keys in every reply, so a reply with other keys is refused (strategies.reply_rules).
TRAIN_METRIC_KEYS = frozenset({
    "num-examples", "client-id", "client-ids", "train-loss", "steps", "train-seconds", "step-seconds", "lr",
    "proximal-mu", "trunk-cached", "sample-rate", "noise-multiplier", "handler-seconds", "cuda"})


def _speaks_for_planned(reply: Message, planned: tuple[int, ...]) -> str | None:
    """The ``client-id`` a reply reports (the DP-SGD ledger files its steps under it) is the planned one."""
    for rec in reply.content.metric_records.values():
        if "client-id" in rec and (int(number(rec["client-id"])),) != tuple(planned):
            return f"reports client-id {rec['client-id']}, asked for {list(planned)}"
    return None


def train_rules(max_examples: int) -> ReplyRules:
    """Reply rules of a federated round: the model sent, finite; exactly the train metrics; sizes <= the plan's."""
    return ReplyRules(max_examples=max(1, int(max_examples)), metric_keys=TRAIN_METRIC_KEYS,
                      content_check=_speaks_for_planned)


class FullCohort(FixedCohort):
    """A fixed cohort in which every client must contribute every round.

    A client that does not answer (error, timeout) fails the round loudly: the paper's protocol is full
    participation. A reply refused for its content (strategies.reply_rules: NaN weights, wrong shapes,
    sizes out of range) is hostile input, not a lost client: it is left out of that round's average,
    recorded (``problems``, the summary's ``round_errors``) and the run goes on with the honest clients.
    """

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        checked = self.checked_train(server_round, replies)
        missing = sorted(set(self.client_ids) - set(checked.contributors) - checked.rejected_clients)
        if not checked.contributors and not missing:
            return None, None  # every reply was refused: the model stays as it was
        if missing:
            raise RuntimeError(f"round {server_round}: {len(checked.contributors)}/{len(self.client_ids)} clients "
                               f"replied; client {missing[0]}: {checked.problem_of.get(missing[0], 'no reply')}")
        # the algorithm's: FixedCohort is a mixin, so the next class in the concrete MRO (FedAvg, FedProx, ...)
        return super(FixedCohort, self).aggregate_train(  # type: ignore[misc]
            server_round, checked.valid_by_client())


class UsFedAvg(FullCohort, ExactConsensusMean, FedAvg):
    """FedAvg (McMahan et al. 2017) over the fixed cohort."""


class UsFedProx(FullCohort, ExactConsensusMean, FedProx):
    """FedProx (Li et al. 2020): Flower transports ``proximal-mu``; the client adds mu/2 ||w - w_t||^2."""


class UsFedAdam(FullCohort, ExactConsensusMean, BufferAveragingFedAdam):
    """FedAdam (Reddi et al. 2021) over the fixed cohort."""


def build_ultrasound_strategy(algorithm: str, *, proximal_mu: float = 0.01, server_lr: float = 0.01,
                              beta1: float = 0.9, beta2: float = 0.99,
                              buffer_keys: Iterable[str] = ()) -> UsFedAvg | UsFedProx | UsFedAdam:
    """'fedavg' | 'fedprox' | 'fedadam' with the paper's settings; no federated evaluation round."""
    common: dict[str, Any] = {"fraction_train": 1.0, "fraction_evaluate": 0.0}
    if algorithm == "fedavg":
        return UsFedAvg(**common)
    if algorithm == "fedprox":
        return UsFedProx(**common, proximal_mu=proximal_mu)
    if algorithm == "fedadam":
        # eta_l is Flower's record of the client lr; the clients use their own Adam lr.
        return UsFedAdam(**common, eta=server_lr, beta_1=beta1, beta_2=beta2, buffer_keys=buffer_keys)
    raise ValueError(f"unknown algorithm {algorithm!r}; allowed: ['fedadam', 'fedavg', 'fedprox']")
