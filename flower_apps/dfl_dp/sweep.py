"""Run the dfl-dp grid (frameworks x conditions x seeds) through Flower and report it.

    python -m flower_apps.dfl_dp.sweep --grid reduced
    python -m flower_apps.dfl_dp.sweep --grid paper --seeds 5
    python -m flower_apps.dfl_dp.sweep --grid reduced --clients 100 --rounds 10 --data-fraction 0.5

Every run writes its own folder atomically; a rerun skips runs whose summary exists for the
same config (resume after an interruption). All pending runs share one simulation (one Ray
start-up). At the end the tables and figures are rebuilt from every finished run.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from flower_apps.config import RUN_CONFIG_DEFAULTS, ConfigError, resolve
from flower_apps.dfl_dp.config import PRESETS, DflDpConfig
from flower_apps.dfl_dp.report import write_report
from flower_apps.dfl_dp.server_app import is_complete, server_main
from flower_apps.studies import STUDIES

log = logging.getLogger("flwr")


@dataclass(frozen=True)
class Grid:
    """A named grid: per-run preset plus the conditions and seeds to sweep."""

    preset: str
    clip_norms: tuple[float, ...]
    eps_cals: tuple[float, ...]
    seeds: int
    frameworks: tuple[str, ...] = ("fl", "sequential-dfl")


GRIDS = {
    # The README's first command: one DP condition against No-DP, both frameworks, minutes.
    "demo": Grid("reduced", (1.0,), (2.0,), 1),
    # The reduced grid: N = 100 kept (sigma_abs ~ C/N), fewer rounds, two seeds for intervals.
    "reduced": Grid("reduced", (0.1, 1.0), (2.0, 4.0), 2),
    # The paper's grid.
    "paper": Grid("paper", (0.1, 0.5, 1.0, 2.0), (0.5, 1.0, 2.0, 3.0, 4.0), 5),
    # Protocol-scale split on offline Fashion-MNIST.
    "protocol-fashion": Grid("protocol-fashion", (0.1, 1.0), (2.0, 4.0), 2),
    # Tests.
    "smoke": Grid("smoke", (1.0,), (2.0,), 1),
}


def build_configs(args: argparse.Namespace) -> list[DflDpConfig]:
    """Every run of the grid as a validated config, No-DP first within each seed."""
    grid = GRIDS[args.grid]
    overrides: dict = {"study": "dfl-dp", "preset": grid.preset, "results-dir": str(Path(args.results_dir).resolve())}
    for key, val in (("num-clients", args.clients), ("num-rounds", args.rounds), ("data-fraction", args.data_fraction),
                     ("dataset", args.dataset), ("clients-per-message", args.clients_per_message),
                     ("data-dir", args.data_dir), ("device", args.device)):
        if val is not None:
            overrides[key] = val
    clip_norms = tuple(args.clip_norms or grid.clip_norms)
    eps_cals = tuple(args.eps_cal or grid.eps_cals)
    seeds = range(args.seed0, args.seed0 + (args.seeds or grid.seeds))
    frameworks = tuple(args.frameworks or grid.frameworks)
    configs = []
    spec = STUDIES["dfl-dp"]
    for seed in seeds:
        for fw in frameworks:
            conds = [{"dp": False}] + [{"dp": True, "clip-norm": c, "eps-cal": e} for c in clip_norms for e in eps_cals]
            for cond in conds:
                raw = {**RUN_CONFIG_DEFAULTS, **overrides, "seed": seed, "framework": fw, **cond}
                # The preset must win over defaults but not over the sweep's explicit knobs.
                _, flat = resolve({k: v for k, v in raw.items()}, STUDIES)
                flat.update({k: v for k, v in overrides.items() if k not in ("preset",)})
                flat.update({"seed": seed, "framework": fw, **cond})
                configs.append(spec.build_config(flat))
    return configs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flower_apps.dfl_dp.sweep", description=__doc__.split("\n")[0])
    p.add_argument("--grid", choices=sorted(GRIDS), default="reduced")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--seeds", type=int, help="number of seeds (default: the grid's)")
    p.add_argument("--seed0", type=int, default=0, help="first seed")
    p.add_argument("--clients", type=int, help="N (keep 100: sigma_abs scales as C/N)")
    p.add_argument("--rounds", type=int, help="T")
    p.add_argument("--data-fraction", type=float)
    p.add_argument("--dataset")
    p.add_argument("--data-dir")
    p.add_argument("--device")
    p.add_argument("--clip-norms", type=float, nargs="+")
    p.add_argument("--eps-cal", type=float, nargs="+")
    p.add_argument("--frameworks", nargs="+", choices=["fl", "sequential-dfl"])
    p.add_argument("--clients-per-message", type=int,
                   help="logical clients per Flower message (transport only; default: the preset's)")
    p.add_argument("--num-cpus", type=float, default=1, help="CPUs per virtual SuperNode (Ray client resources)")
    p.add_argument("--num-gpus", type=float, default=None, help="GPUs per virtual SuperNode (default: 0.5 if CUDA)")
    p.add_argument("--report-only", action="store_true", help="only rebuild tables and figures")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        configs = build_configs(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.report_only:
        pending = [c for c in configs if not is_complete(c)]
        print(f"dfl-dp sweep '{args.grid}': {len(configs)} runs, {len(configs) - len(pending)} already done, "
              f"{len(pending)} to run", flush=True)
        if pending:
            _run(pending, args)
    md = write_report(args.results_dir)
    print(md)
    print(f"Tables and figures in {Path(args.results_dir).resolve() / 'dfl-dp'}")
    return 0


def _run(pending: list[DflDpConfig], args: argparse.Namespace) -> None:
    import torch

    from flower_apps.runner import run_many_in_process

    num_gpus = args.num_gpus if args.num_gpus is not None else (0.5 if torch.cuda.is_available() else 0.0)
    nodes = max(math.ceil(c.num_clients / c.clients_per_message) for c in pending)
    t0 = time.perf_counter()
    done = [0]

    def on_done(cfg: DflDpConfig, summary: dict) -> None:
        done[0] += 1
        el = time.perf_counter() - t0
        eta = el / done[0] * (len(pending) - done[0])
        print(f"[{done[0]}/{len(pending)}] {summary['run']}: final acc {summary['final_acc']:.4f} "
              f"({summary['wall_seconds']:.0f}s; sweep {el:.0f}s elapsed, ETA {eta:.0f}s)", flush=True)

    run_many_in_process(pending, server_main, nodes, args.num_cpus, num_gpus, on_done=on_done)
    missing = [c for c in pending if not is_complete(c)]
    if missing:
        raise RuntimeError(f"{len(missing)} runs did not finish, e.g. {missing[0].default_run_name}; rerun to resume")


if __name__ == "__main__":
    raise SystemExit(main())
