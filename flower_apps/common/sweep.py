"""What every study's sweep does: build its configs, run the pending ones in one simulation, report.

:func:`sweep_main` is a sweep's command (refuse a bad grid with exit status 2, resume, report);
:func:`pending_runs` says what is left of any resumable list (learning runs, transport
measurements); :func:`run_pending` runs configs in one Flower simulation with progress lines.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid


def sweep_parser(module: str, doc: str, seeds_help: str = "number of seeds (default: the grid's)",
                 **seeds_kw: Any) -> argparse.ArgumentParser:
    """The command line of ``python -m <module>`` with the flags every sweep has.

    --results-dir, --seeds, --seed0, --num-cpus, --report-only; ``doc``'s first line is the
    description. The study adds its grid and knobs.
    """
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n")[0])
    p.add_argument("--results-dir", default="results")
    p.add_argument("--seeds", type=int, help=seeds_help, **seeds_kw)
    p.add_argument("--seed0", type=int, default=0, help="first seed")
    p.add_argument("--num-cpus", type=float, default=1, help="CPUs per virtual SuperNode (Ray client resources)")
    p.add_argument("--report-only", action="store_true", help="only rebuild tables and figures")
    p.add_argument("--noise-seed-file", type=lambda f: str(Path(f).resolve()),
                   help="a LOCAL secret file that seeds the DP noise, for bit-reproducible DP runs "
                        "(default: secure noise from OS entropy; see README, Privacy)")
    return p


def add_data_args(p: argparse.ArgumentParser, datasets: Sequence[str] | None = None,
                  data_dir_help: str | None = None) -> None:
    """--dataset (one of ``datasets`` if given), --data-dir, --data-fraction and --device (same-named run keys)."""
    p.add_argument("--dataset", choices=datasets)
    p.add_argument("--data-dir", help=data_dir_help)
    p.add_argument("--data-fraction", type=float)
    p.add_argument("--device")


def sweep_overrides(study: str, preset: str, results_dir: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """Run keys of every run of a sweep: study, preset, the absolute results folder, and the given knobs.

    ``knobs`` maps run keys to command-line values; those left out (None) keep the preset's value.
    """
    return {"study": study, "preset": preset, "results-dir": str(Path(results_dir).resolve()),
            **{k: v for k, v in knobs.items() if v is not None}}


def run_keys(overrides: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One run's flat, checked run config: defaults < the study's preset < the sweep's knobs < the run's keys.

    The preset wins over defaults but not over a knob the sweep sets, even one equal to its default.
    """
    from flower_apps.config import RUN_CONFIG_DEFAULTS, resolve
    from flower_apps.studies import STUDIES

    _, flat = resolve({**RUN_CONFIG_DEFAULTS, **overrides, **run}, STUDIES, given={*overrides, *run})
    return flat


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


def pending_runs(study: str, grid: str, configs: Sequence[Any], is_complete: Callable[[Any], bool],
                 noun: str = "runs") -> list[Any]:
    """The items not finished yet (resume), after one line saying how many are done and to run."""
    pending = [c for c in configs if not is_complete(c)]
    print(f"{study} sweep '{grid}': {len(configs)} {noun}, {len(configs) - len(pending)} already done, "
          f"{len(pending)} to run", flush=True)
    return pending


def sweep_main(study: str, grid: str, build: Callable[[], list[Any]], is_complete: Callable[[Any], bool],
               run: Callable[[list[Any]], None], report: Callable[[list[Any]], str], out: Path, *,
               report_only: bool = False, list_only: bool = False,
               before: Callable[[list[Any]], None] | None = None) -> int:
    """A sweep's command: build the configs, run the pending ones, rebuild and print the report.

    ``build()`` raises ConfigError / ValueError for a bad grid (printed as one line, exit status 2).
    ``run(pending)`` gets the unfinished configs; ``before(configs)``, if given, runs first (a
    study's own resumable phase, e.g. network-only measurements). ``report(configs)`` returns
    the Markdown of the tables written under ``out``. ``list_only`` prints the run names and stops.
    """
    from flower_apps.config import ConfigError

    try:
        configs = build()
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if list_only:
        print("\n".join(c.default_run_name for c in configs))
        return 0
    if not report_only:
        if before is not None:
            before(configs)
        pending = pending_runs(study, grid, configs, is_complete) if configs else []
        if pending:
            run(pending)
    print(report(configs))
    print(f"Tables and figures in {Path(out).resolve()}")
    return 0
