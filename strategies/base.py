"""Base class: Flower's round loop, with a pluggable communication pattern.

``Strategy.start`` (Flower) is the one round loop. A subclass picks *how* the round's
messages travel by returning a grid view from :meth:`prepare_grid`: broadcast-and-collect
for FL, a relay for token passing. Wrappers (strategies.wrapper) delegate ``prepare_grid`` to the
strategy they wrap, like the rest of the protocol (strategies.layer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from threadpoolctl import threadpool_limits

from privacy.sampling import CohortSampler
from strategies.cohorts import PlanChecked, build_messages, plan_cohorts
from strategies.layer import Layer, start_rounds
from strategies.transport import send_and_receive


class FastGrid:
    """A Grid view whose ``send_and_receive`` polls tightly (see strategies.transport)."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid

    def __getattr__(self, name: str):  # delegate everything else to the real grid
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return send_and_receive(self._grid, messages, timeout=timeout)


class PatternStrategy(Layer, Strategy):
    """A Flower strategy whose round uses the grid view returned by ``prepare_grid`` (strategies.layer's protocol)."""

    #: How the round's aggregate weights its members: "equal" (every contributor counts once, what the
    #: DP wrappers size their noise for: strategies.matched_perturbation) or "examples" (by reported
    #: example counts, strategies.fedavg_examples). Wrappers answer with the value of the strategy they wrap.
    member_weights = "equal"
    #: Which planned clients a reply carries a model for: "each", "last" or "none" (strategies.cohorts).
    array_claims = "each"

    def prepare_grid(self, grid: Grid) -> Grid:
        """Return the grid view this strategy's rounds communicate through."""
        return FastGrid(grid)  # type: ignore[return-value]

    def round_limits(self) -> AbstractContextManager[object]:
        # The server's NumPy math (clipping, noise, canaries: model-sized, memory-bound vectors) runs on one
        # BLAS thread. Idle OpenBLAS workers spin after each call and took a core from the central evaluation
        # and the in-process SuperLink (issue 37: the audited FL round, twice as many clips, ran 1.26x; see
        # docs/audit.md). Torch keeps its own threads.
        return threadpool_limits(limits=1, user_api="blas")

    def start(  # same contract as flwr's Strategy.start
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        return start_rounds(self, grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config,
                            evaluate_fn)

    # Studies evaluate centrally (server-side test set); no federated evaluation round.
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None


class LogicalClientStrategy(PlanChecked, PatternStrategy):
    """A pattern strategy over named logical clients, ``train.<action>`` messages.

    Parameters
    ----------
    client_ids : the logical clients (the population; all of them take part every round unless ``sampler``).
    action : ClientApp action that trains them (message type ``train.<action>``).
    clients_per_message : logical clients packed in one message (transport only: same math).

    ``placement`` (logical client -> node id; None in a simulation) is the explicit plan of a
    node-local deployment: each message goes to the node holding its clients (strategies.cohorts).
    ``sampler`` (privacy.sampling.CohortSampler; None = full participation, the seed paper's setting):
    the server's secret per-round draw; only the sampled clients get a message, so a reply for any other
    client answers nothing this round sent and is refused (strategies.cohorts.check_replies).
    """

    placement: dict[int, int] | None = None
    sampler: CohortSampler | None = None

    def __init__(self, client_ids: list[int], action: str, clients_per_message: int = 1) -> None:
        self.client_ids = list(client_ids)
        self.action = action
        self.clients_per_message = clients_per_message
        self.cohort = list(self.client_ids)  # this round's planned clients (all of them without a sampler)

    def sample_with(self, sampler: CohortSampler) -> None:
        """Draw each round's cohort with ``sampler`` (client sampling) instead of asking every client."""
        self.sampler = sampler
        # A seeded sampler's generator could be saved like the noise's; no study resumes a sampled run yet.
        self.unresumable = "its cohort sampler's draws live in this process only"

    def round_cohort(self, server_round: int) -> list[int]:
        """The clients round ``server_round`` asks, in client order: all of them, or the sampler's draw."""
        if self.sampler is None:
            return list(self.client_ids)
        if self.sampler.num_clients != len(self.client_ids):
            raise ValueError(f"the sampler draws from {self.sampler.num_clients} clients, the strategy has "
                             f"{len(self.client_ids)}")
        return [self.client_ids[int(i)] for i in self.sampler.clients(server_round)]

    def cohort_metrics(self, metrics: MetricRecord) -> MetricRecord:
        """``metrics`` with ``num-sampled`` (the round's planned clients) when the round was sampled."""
        if self.sampler is not None:
            metrics["num-sampled"] = len(self.cohort)
        return metrics

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config["server-round"] = server_round
        self.cohort = self.round_cohort(server_round)
        if not self.cohort:  # an empty Poisson draw: nobody is asked (the DP wrapper still releases noise)
            return self.remember([])
        plan = plan_cohorts(self.cohort, list(grid.get_node_ids()), self.clients_per_message, self.placement)
        return self.remember(build_messages(plan, arrays, config, self.action))
