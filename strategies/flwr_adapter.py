"""Every non-public piece of Flower the project uses, in one place, gated on flwr 1.42.0.

Flower's public API is what ``flwr.app``, ``flwr.serverapp``, ``flwr.serverapp.strategy``,
``flwr.clientapp`` and ``flwr.simulation`` export, and the ``flwr`` CLI. Everything else the shared
packages, the apps and the deployment tooling read of Flower goes through a function here; no other
module imports ``flwr.common``, ``flwr.supercore``, ``flwr.superlink``, ``flwr.cli``, a strategy's
implementation module or a private name. Each access checks the installed flwr against :data:`FLWR`
first: an untested version raises :class:`~registry.third_party.UntestedVersionError`, except the
cosmetic logger name, which warns. Flower is imported inside the functions, not at import time: the
deployment CLIs (deploy/launch.py, deploy/export.py, ...) import this module and start no ServerApp.

What each access is for (-> the upstream public alternative, if any):

* ``flwr.serverapp.strategy.strategy_utils.aggregate_arrayrecords``: :func:`weighted_mean_arrays`, the
  weighted mean of Flower's FedAvg family, bit for bit (strategies.exact_mean) (-> only inside
  ``FedAvg.aggregate_train``, which also aggregates metrics and checks replies).
* ``flwr.serverapp.strategy.fedopt.FedOpt`` and its private ``_compute_deltat_and_mt``:
  :class:`FedOptMeanHook`, a step on the weighted mean after FedAvg formed it and before FedAdam /
  FedAdagrad / FedYogi form the pseudo-gradient (strategies.exact_mean) (-> none; ``FedOpt`` is not
  exported and the FedOpt strategies offer no hook there).
* ``flwr.supercore.differential_privacy.compute_clip_model_update`` / ``compute_stdv``: Flower's own
  clipping and sigma of ``DifferentialPrivacyServerSideFixedClipping`` (strategies.server_fixed_clipping)
  (-> only inside that class).
* ``flwr.common.logger.LOGGER_NAME``: the name of Flower's logger, whose propagation
  flower_apps/common/logs.py switches off around in-process simulations -- cosmetic (a log line printed
  twice), so an untested version only warns (-> none; it is "flwr").
* ``flwr.common.config.parse_config_args``: :func:`parse_run_config`, exactly how ``flwr run
  --run-config`` and ``flower-supernode --node-config`` parse overrides (deploy/) (-> none; the CLI
  parses them internally).
* ``flwr.supercore.task_identity.TaskIdentity`` (its private ``_task_id`` / ``_run_id`` / ``_node_id``):
  :func:`task_identity`, the identity a Message needs, outside a simulation or SuperNode (in-process
  replays, tests) (-> none; the simulation and SuperNode set it).

tests/strategies/test_flwr_adapter.py checks these against stock Flower (FedAvg's and FedAdam's results,
``DifferentialPrivacyServerSideFixedClipping``'s clip and sigma) and that the gates fire.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from registry.third_party import VersionGate

if TYPE_CHECKING:
    import numpy as np
    from flwr.app import ArrayRecord, RecordDict

FLWR = VersionGate("flwr", "==1.42.0", adapter="strategies/flwr_adapter.py",
                   tests="tests/strategies/test_flwr_adapter.py")


def weighted_mean_arrays(records: list[RecordDict], weighting_metric_name: str) -> ArrayRecord:
    """Flower's weighted mean of every ArrayRecord in ``records`` (weights: the named metric), as FedAvg forms it."""
    FLWR.require("weighted_mean_arrays (Flower's aggregate_arrayrecords)")
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    return aggregate_arrayrecords(records, weighting_metric_name)


def is_fedopt(strategy: object) -> bool:
    """Whether ``strategy`` is one of Flower's FedOpt strategies (FedAdam, FedAdagrad, FedYogi)."""
    FLWR.require("is_fedopt (Flower's FedOpt base class)")
    from flwr.serverapp.strategy.fedopt import FedOpt

    return isinstance(strategy, FedOpt)


class FedOptMeanHook:
    """Mixin before a Flower FedOpt strategy: :meth:`adjust_fedopt_mean` edits the weighted mean before the
    pseudo-gradient delta_t = mean - current is formed (and with it m_t, v_t and the step).

    It overrides FedOpt's private ``_compute_deltat_and_mt``, the one place the FedOpt strategies read the
    mean; on another strategy the override is never called.
    """

    def adjust_fedopt_mean(self, aggregated: ArrayRecord) -> ArrayRecord:
        """The weighted mean the FedOpt step uses (default: unchanged)."""
        return aggregated

    def _compute_deltat_and_mt(self, aggregated_arrayrecord: ArrayRecord) -> Any:
        FLWR.require("FedOptMeanHook (FedOpt._compute_deltat_and_mt)")
        return super()._compute_deltat_and_mt(self.adjust_fedopt_mean(aggregated_arrayrecord))  # type: ignore[misc]


def flower_clip_model_update(params: list[np.ndarray], current: list[np.ndarray], clipping_norm: float) -> None:
    """Flower's clipping of the update params - current to ``clipping_norm``, written into ``params`` in place."""
    FLWR.require("flower_clip_model_update (flwr.supercore.differential_privacy)")
    from flwr.supercore.differential_privacy import compute_clip_model_update

    compute_clip_model_update(params, current, clipping_norm)


def flower_stdv(noise_multiplier: float, clipping_norm: float, num_sampled_clients: int) -> float:
    """Flower's sigma of server-side fixed clipping: noise_multiplier * clipping_norm / num_sampled_clients."""
    FLWR.require("flower_stdv (flwr.supercore.differential_privacy)")
    from flwr.supercore.differential_privacy import compute_stdv

    return float(compute_stdv(noise_multiplier, clipping_norm, num_sampled_clients))


def flower_logger_name() -> str:
    """The name of Flower's logger (cosmetic use: an untested flwr warns and the name is still returned)."""
    FLWR.warn("flower_logger_name (flwr.common.logger.LOGGER_NAME)")
    from flwr.common.logger import LOGGER_NAME

    return str(LOGGER_NAME)


def parse_run_config(args: list[str] | None) -> dict[str, Any]:
    """``key=value`` overrides parsed as ``flwr run --run-config`` / ``flower-supernode --node-config`` parse them."""
    FLWR.require("parse_run_config (flwr.common.config.parse_config_args)")
    from flwr.common.config import parse_config_args

    return dict(parse_config_args(args))


@contextmanager
def task_identity(*, replace: bool = False) -> Iterator[None]:
    """A dummy task identity (task 1, run 1, node 0) for the block, which a Message needs outside a simulation
    or SuperNode (a ClientApp handler or a ServerApp on a replay grid called in-process); the one found
    before is restored after. ``replace=False`` keeps an identity that is already set (inside a simulation)."""
    FLWR.require("task_identity (flwr.supercore.task_identity.TaskIdentity)")
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    if replace or None in old:
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old
