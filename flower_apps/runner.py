"""Run studies in-process through Flower's simulation engine (tests, sweeps, benchmarks)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from flower_apps.common.logs import flower_logs_once
from flower_apps.common.results import RunFinished, RunInProgress, check_rerun, check_run_folder, run_folder
from flower_apps.router import make_client_app, make_server_app, prepare


def backend_config(num_cpus: float = 1, num_gpus: float = 0.0) -> dict:
    """Ray backend config with per-client resources.

    With ``RAY_ADDRESS`` set, the simulation joins that existing Ray cluster (Ray refuses
    ``num_cpus`` when joining one); otherwise it starts a local Ray with this machine's CPUs.
    """
    init_args: dict = {"include_dashboard": False}
    if os.environ.get("RAY_ADDRESS"):
        init_args["address"] = os.environ["RAY_ADDRESS"]
    else:
        init_args["num_cpus"] = os.cpu_count() or 1
    return {"client_resources": {"num_cpus": num_cpus, "num_gpus": num_gpus}, "init_args": init_args}


def simulate(server_app: ServerApp, num_supernodes: int, num_cpus: float = 1, num_gpus: float = 0.0) -> None:
    """``flwr.simulation.run_simulation`` with the project's ClientApp, each log line printed once."""
    with flower_logs_once():
        run_simulation(server_app=server_app, client_app=make_client_app(), num_supernodes=num_supernodes,
                       backend_config=backend_config(num_cpus, num_gpus))


def run_config_in_process(overrides: dict[str, Any], num_supernodes: int | None = None,
                          num_cpus: float = 1, num_gpus: float = 0.0) -> None:
    """Validate ``overrides`` and the run folder (raises before any work), then run them through the simulation.

    A folder holding a finished run of another config, or of this one without ``rerun='replace'``, is
    refused here, before Ray starts (the ServerApp checks again when it opens the folder).
    """
    from flower_apps.config import RUN_CONFIG_DEFAULTS

    spec, cfg = prepare({**RUN_CONFIG_DEFAULTS, **overrides}, given=overrides)
    if all(hasattr(cfg, a) for a in ("results_dir", "run_name", "default_run_name")):  # the studies' run folders
        folder = run_folder(spec.name, cfg)
        check_run_folder(folder, cfg)
        check_rerun(folder, cfg)
    n = num_supernodes or spec.nodes_needed(cfg)
    simulate(make_server_app(overrides), n, num_cpus, num_gpus)


def run_many_in_process(configs: list[Any], server_main: Callable[[Grid, Any], dict], num_supernodes: int,
                        num_cpus: float = 1, num_gpus: float = 0.0,
                        on_done: Callable[[Any, dict], None] | None = None) -> None:
    """Run several already-validated configs in ONE simulation (one Ray start-up).

    Clients are stateless (they read the config from each message), so consecutive runs
    share the virtual SuperNodes. Each run writes its own results folder as it finishes. A run whose
    folder another process is writing (a second sweep over an overlapping grid) is skipped, not shared;
    so is one that such a process finished meanwhile (its results are kept).
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for cfg in configs:
            try:
                summary = server_main(grid, cfg)
            except (RunInProgress, RunFinished) as e:  # another process (a second sweep) writes or wrote it
                print(f"skipped: {e}", flush=True)
                continue
            if on_done:
                on_done(cfg, summary)

    simulate(app, num_supernodes, num_cpus, num_gpus)


def run_many_timed(configs: list[Any], server_main: Callable[[Grid, Any], dict], num_supernodes: int,
                   run_dir: Callable[[Any], Any]) -> dict[str, float]:
    """:func:`run_many_in_process`, and each run's wall seconds keyed by ``str(run_dir(cfg))``: from the
    previous run's end (the first run's include Ray's start-up)."""
    walls: dict[str, float] = {}
    started = [time.perf_counter()]

    def done(cfg, _summary: dict) -> None:
        now = time.perf_counter()
        walls[str(run_dir(cfg))] = now - started[0]
        started[0] = now

    run_many_in_process(configs, server_main, num_supernodes=num_supernodes, on_done=done)
    return walls
