"""Per-run cost of the supported engine (``flwr run`` on a local SuperLink) against the in-process one.

    python benchmarks/engine_overhead.py [--runs 3] [--rounds 1] [--results-dir /tmp/ppfl-engines]

Runs ``--runs`` seeds of the dfl-dp smoke preset (No-DP, ``--rounds`` rounds, 2 SuperNodes, 1 CPU per
client) through each engine, as a sweep does (``flower_apps.runner.run_many``): in-process, all in one
simulation (one Ray start-up); SuperLink, one ``flwr run`` each on one SuperLink started for them (a
``flwr-simulation`` process and a Ray start per run). Prints each engine's wall seconds, in total and
per run, and the SuperLink's extra seconds per run; the ratio is SuperLink / in-process. Both write the
same numbers (tests/flower_apps/test_engines.py); only the time differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")


def measure(runs: int = 3, rounds: int = 1, results_dir: str = "/tmp/ppfl-engines") -> dict[str, float]:
    """Wall seconds of ``runs`` dfl-dp smoke runs per engine; the SuperLink's extra seconds per run."""
    from flower_apps.config import RUN_CONFIG_DEFAULTS
    from flower_apps.router import prepare
    from flower_apps.runner import run_many
    from flower_apps.studies import STUDIES

    spec = STUDIES["dfl-dp"]
    out: dict[str, float] = {}
    for engine in ("inprocess", "superlink"):
        root = Path(results_dir) / engine
        shutil.rmtree(root, ignore_errors=True)
        keys = {"study": "dfl-dp", "preset": "smoke", "dp": False, "num-rounds": rounds, "results-dir": str(root)}
        configs = [prepare({**RUN_CONFIG_DEFAULTS, **keys, "seed": s}, given={*keys, "seed"})[1] for s in range(runs)]
        t0 = time.perf_counter()
        run_many(configs, spec.server_main, max(spec.nodes_needed(c) for c in configs), num_cpus=1, engine=engine)
        out[engine] = time.perf_counter() - t0
    out["extra_per_run"] = (out["superlink"] - out["inprocess"]) / runs
    return out


def rows(runs: int = 3) -> list[dict]:
    """The benchmark table's rows (python -m benchmarks --only engine): seconds per run through each engine."""
    r = measure(runs)
    per = {e: r[e] / runs for e in ("inprocess", "superlink")}
    return [{"metric": f"dfl-dp smoke run (1 round) through flwr run on a local SuperLink, s per run [vs in-process, "
                       f"{runs} runs]", "value": per["superlink"], "reference": per["inprocess"], "ratio": None,
             "target": None, "met": None},
            {"metric": "flwr run's extra seconds per run over the in-process engine", "value": r["extra_per_run"],
             "reference": None, "ratio": None, "target": None, "met": None}]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--results-dir", default="/tmp/ppfl-engines")
    args = p.parse_args()
    r = measure(args.runs, args.rounds, args.results_dir)
    print(f"\n| engine | wall s ({args.runs} runs) | s per run |\n|---|---|---|")
    for engine in ("inprocess", "superlink"):
        print(f"| {engine} | {r[engine]:.1f} | {r[engine] / args.runs:.1f} |")
    print(f"\nSuperLink: {r['extra_per_run']:+.1f} s per run, ratio {r['superlink'] / r['inprocess']:.2f} "
          f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
