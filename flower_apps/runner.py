"""Run studies: through ``flwr run`` on a local SuperLink (the supported path), or in-process.

Two engines (:data:`ENGINES`), one choice per call:

* ``'superlink'`` (the default): each run one ``flwr run`` on one local simulation SuperLink per sweep
  (:mod:`flower_apps.superlink`), what flwr 1.42 supports;
* ``'inprocess'``: a ServerApp built here, run through the adapter around the deprecated
  ``flwr.simulation.run_simulation`` (:mod:`flower_apps.engine`, which says why it is kept): what
  benchmarks, audit trials, studies registered in this process only and :func:`run_config_in_process`
  need, and a faster choice for many short runs (``--engine inprocess`` or ``PPFL_ENGINE=inprocess``;
  the test suite sets it).

Both give the same models, rounds and summaries, bit for bit (tests/flower_apps/test_engines.py).
dfl-dp's mean update norm used to come out one ulp apart between them (it was summed in reply arrival
order; strategies.matched_perturbation now sums it in client order). What the supported path costs,
measured on the quiet 2-core machine (``python -m benchmarks --only engine``, 3 dfl-dp smoke runs of one
round; kept in results_bench/benchmarks.json): about 25 s more per run through the SuperLink (a
``flwr run`` with its FAB, a ``flwr-simulation`` process importing torch, a Ray start); a sweep of runs
that take minutes each pays a few percent, a grid of smoke runs about 4x.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flower_apps.common.results import RunFinished, RunInProgress, check_rerun, check_run_folder, run_folder
from flower_apps.config import StudySpec
from flower_apps.engine import simulate
from flower_apps.router import check_export_config, make_server_app, prepare

ENGINES = ("superlink", "inprocess")
ENGINE_ENV = "PPFL_ENGINE"  # the default engine where a caller names none (unset: 'superlink')

__all__ = ["ENGINES", "default_engine", "pick_engine", "run_config_in_process", "run_many", "run_many_in_process",
           "run_many_timed", "simulate"]


def default_engine() -> str:
    """``$PPFL_ENGINE`` if set (checked), else ``'superlink'``, flwr 1.42's supported path (see the module doc)."""
    engine = os.environ.get(ENGINE_ENV, "superlink")
    if engine not in ENGINES:
        raise ValueError(f"{ENGINE_ENV} must be one of {ENGINES}, got {engine!r}")
    return engine


def pick_engine(engine: str | None, server_main: Callable[[Grid, Any], dict]) -> tuple[str, StudySpec | None]:
    """(engine, the study whose registered ``server_main`` this is) for a batch of runs.

    ``flwr run`` can only start a built-in study's own ``server_main`` (the FAB's router runs it from
    run keys). A batch with another ``server_main`` (a wrapper, a study registered in this process):
    ``'inprocess'`` when no engine was named, a ValueError when ``'superlink'`` was.
    """
    from flower_apps.studies import BUILTIN_STUDIES, STUDIES

    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    chosen = engine or default_engine()
    spec = next((s for s in STUDIES.values() if s.server_main is server_main), None)
    if chosen == "superlink" and (spec is None or spec.name not in BUILTIN_STUDIES):
        why = ("it is not a registered study's server_main" if spec is None
               else f"study {spec.name!r} is registered in this process only, not in the Flower App flwr run ships")
        if engine == "superlink":
            raise ValueError(f"engine='superlink' cannot run {getattr(server_main, '__name__', server_main)!r}: "
                             f"{why}; use engine='inprocess'")
        print(f"in-process engine: {why}", flush=True)
        chosen = "inprocess"
    return chosen, spec


def run_many(configs: list[Any], server_main: Callable[[Grid, Any], dict], num_supernodes: int,
             num_cpus: float = 1, num_gpus: float = 0.0, on_done: Callable[[Any, dict], None] | None = None,
             engine: str | None = None) -> str:
    """Run already-validated configs on ``num_supernodes`` SuperNodes with the engine :func:`pick_engine`
    chooses; ``on_done(cfg, summary)`` after each. Returns the engine used."""
    chosen, spec = pick_engine(engine, server_main)
    if chosen == "superlink":
        from flower_apps.superlink import run_many_on_superlink

        assert spec is not None
        run_many_on_superlink(spec, configs, num_supernodes, num_cpus, num_gpus, on_done=on_done)
    else:
        run_many_in_process(configs, server_main, num_supernodes, num_cpus, num_gpus, on_done=on_done)
    return chosen


def run_config_in_process(overrides: dict[str, Any], num_supernodes: int | None = None,
                          num_cpus: float = 1, num_gpus: float = 0.0) -> None:
    """Validate ``overrides`` and the run folder (raises before any work), then run them in-process (adapter).

    A folder holding a finished run of another config, or of this one without ``rerun='replace'``, is
    refused here, before Ray starts (the ServerApp checks again when it opens the folder).
    """
    from flower_apps.config import RUN_CONFIG_DEFAULTS

    spec, cfg = prepare({**RUN_CONFIG_DEFAULTS, **overrides}, given=overrides)
    check_export_config(spec, cfg)  # a node-local config must match its export.json, before Ray starts
    if all(hasattr(cfg, a) for a in ("results_dir", "run_name", "default_run_name")):  # the studies' run folders
        folder = run_folder(spec.name, cfg)
        check_run_folder(folder, cfg)
        check_rerun(folder, cfg)
    n = num_supernodes or spec.nodes_needed(cfg)
    simulate(make_server_app(overrides), n, num_cpus, num_gpus)


def run_many_in_process(configs: list[Any], server_main: Callable[[Grid, Any], dict], num_supernodes: int,
                        num_cpus: float = 1, num_gpus: float = 0.0,
                        on_done: Callable[[Any, dict], None] | None = None) -> None:
    """Run several already-validated configs in ONE in-process simulation (one Ray start-up; the adapter).

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
