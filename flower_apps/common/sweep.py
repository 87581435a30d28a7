"""What every study's sweep does with its pending runs: one simulation, progress, a completeness check."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from flwr.serverapp import Grid


def run_pending(pending: list[Any], server_main: Callable[[Grid, Any], dict], is_complete: Callable[[Any], bool],
                *, nodes: int, num_cpus: float, num_gpus: float, describe: Callable[[dict], str]) -> None:
    """Run ``pending`` configs in ONE simulation on ``nodes`` virtual SuperNodes, printing progress.

    ``describe(summary)`` is the study's one-line result of a finished run. Raises if any run did not
    finish (each finished run is already written: a rerun resumes).
    """
    from flower_apps.runner import run_many_in_process

    t0 = time.perf_counter()
    done = [0]

    def on_done(cfg: Any, summary: dict) -> None:
        done[0] += 1
        el = time.perf_counter() - t0
        eta = el / done[0] * (len(pending) - done[0])
        print(f"[{done[0]}/{len(pending)}] {summary['run']}: {describe(summary)} "
              f"({summary['wall_seconds']:.0f}s; sweep {el:.0f}s elapsed, ETA {eta:.0f}s)", flush=True)

    run_many_in_process(pending, server_main, nodes, num_cpus, num_gpus, on_done=on_done)
    missing = [c for c in pending if not is_complete(c)]
    if missing:
        raise RuntimeError(f"{len(missing)} runs did not finish, e.g. {missing[0].default_run_name}; rerun to resume")
    print(f"sweep finished in {time.perf_counter() - t0:.0f}s", flush=True)


def pending_runs(study: str, grid: str, configs: list[Any], is_complete: Callable[[Any], bool]) -> list[Any]:
    """The configs not finished yet (resume), after one line saying how many are done and to run."""
    pending = [c for c in configs if not is_complete(c)]
    print(f"{study} sweep '{grid}': {len(configs)} runs, {len(configs) - len(pending)} already done, "
          f"{len(pending)} to run", flush=True)
    return pending
