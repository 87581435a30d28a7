"""The in-process simulation: ``flwr.simulation.run_simulation`` behind one adapter (the only module that calls it).

What flwr 1.42 deprecates (``flwr/simulation/run_simulation.py``): the whole function. Its first act
is ``warn_deprecated_feature("The `run_simulation` function is deprecated and will be removed in a
future version of Flower. Please use `flwr run` in the CLI instead ...")``, whatever the arguments
(``enable_tf_gpu_growth=True`` earns a second warning of its own). The current way is ``flwr run``
against a SuperLink whose simulation runtime (``flwr-simulation``) loads the ServerApp and ClientApp
from the app's FAB, by name, in processes of its own: :mod:`flower_apps.superlink` (a sweep's
``--engine superlink``).

Why an in-process path is kept: 1.42 has no supported form of what it does, which is to run a
ServerApp *object* built in the calling process against the Simulation Runtime:

* instruments around a grid or a strategy that live in the caller: ``benchmarks/dfl_dp_round.py``
  (``HopProbe`` timing every push and pull, a cProfile of the ServerApp thread),
  ``benchmarks/gpu_check.py`` (a recording grid), the audit trials and ``benchmarks/audit_overhead.py``
  (timed ``server_main`` wrappers), ``unlinkable_dfl.netlearn`` (a ``server_main`` taking an argument
  no run key carries);
* studies registered in the calling process only (``register_study`` / ``registered`` in the tests
  and notebooks): ``flwr run`` ships the FAB, whose router registers the built-in studies alone;
* the test suite's end-to-end runs, many configs in one Ray start-up (a ``flwr run`` pays a
  ``flwr-simulation`` and a Ray start per run: ``benchmarks/engine_overhead.py`` measures it);
* the sweeps' default, for now: :mod:`flower_apps.runner` says why (the SuperLink's per-run cost is unmeasured).

``tests/flower_apps/test_engines.py`` runs the same configs through both paths and compares their
results bit for bit.

The deprecation warning: the adapter rewrites exactly that record (:class:`RunSimulationDeprecation`)
into one line that names this module, so the choice is visible where it is made and documented here,
and is not a multi-line "will be removed" banner before every test run or benchmark. Every other
record, other deprecation warnings included, passes untouched.
"""

from __future__ import annotations

import logging
import os

from flwr.serverapp import ServerApp
from flwr.simulation import run_simulation

from flower_apps.common.logs import flower_logs_once
from flower_apps.common.ray_notices import hide_metrics_agent_notices
from flower_apps.router import make_client_app
from strategies.flwr_adapter import flower_logger_name

#: the start of the message flwr 1.42's run_simulation passes to warn_deprecated_feature
DEPRECATION = "The `run_simulation` function is deprecated"
NOTICE = ("in-process simulation through flwr.simulation.run_simulation (deprecated in flwr 1.42; kept for "
          "in-process instruments, see flower_apps/engine.py; `--engine superlink` runs sweeps through flwr run)")


class RunSimulationDeprecation(logging.Filter):
    """Rewrite flwr's ``run_simulation`` deprecation record (and only it) to the one line :data:`NOTICE`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and isinstance(record.args, tuple) and DEPRECATION in str(record.args[0]):
            record.msg, record.args = NOTICE, ()
        return True


def backend_config(num_cpus: float = 1, num_gpus: float = 0.0) -> dict:
    """Ray backend config with per-client resources.

    With ``RAY_ADDRESS`` set, the simulation joins that existing Ray cluster (Ray refuses
    ``num_cpus`` when joining one); otherwise it starts a local Ray of its own with this machine's CPUs,
    ``address="local"``: without it ``ray.init`` attaches to any cluster a ``ray start`` left on the machine
    (``/tmp/ray/ray_current_cluster``), refuses the ``num_cpus`` then, and the simulation hangs (issue 41).
    """
    init_args: dict = {"include_dashboard": False}
    if os.environ.get("RAY_ADDRESS"):
        init_args["address"] = os.environ["RAY_ADDRESS"]
    else:
        init_args["address"] = "local"
        init_args["num_cpus"] = os.cpu_count() or 1
    return {"client_resources": {"num_cpus": num_cpus, "num_gpus": num_gpus}, "init_args": init_args}


def simulate(server_app: ServerApp, num_supernodes: int, num_cpus: float = 1, num_gpus: float = 0.0,
             backend: dict | None = None) -> None:
    """Run ``server_app`` against the project's ClientApp on ``num_supernodes`` virtual SuperNodes, in-process.

    ``backend``: a Ray backend config (default :func:`backend_config` of ``num_cpus`` / ``num_gpus``; one that
    attaches to a Ray cluster: ``deploy.ray_cluster.cluster_backend_config``).
    Each Flower log line is printed once (:func:`flower_apps.common.logs.flower_logs_once`).
    """
    logger = logging.getLogger(flower_logger_name())
    notice = RunSimulationDeprecation()
    logger.addFilter(notice)
    hide_metrics_agent_notices(only_if_imported=False)  # run_simulation imports Ray anyway
    try:
        with flower_logs_once():
            run_simulation(server_app=server_app, client_app=make_client_app(), num_supernodes=num_supernodes,
                           backend_config=backend or backend_config(num_cpus, num_gpus))
    finally:
        logger.removeFilter(notice)
