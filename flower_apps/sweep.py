"""A sweep of any registered study: a grid of run keys times seeds, resumable, then the study's report card.

    python -m flower_apps.sweep --study dfl-dp --preset smoke --seeds 3 --grid eps-cal=1,4 --grid framework=fl
    python -m flower_apps.sweep --study my-study --preset smoke --seeds 2 --set lr=0.01 --list

Every combination of the ``--grid`` values runs for each seed (``--seed0`` ... ``--seed0 + seeds - 1``), all
in ONE Flower simulation on as many SuperNodes as the largest run needs (``StudySpec.nodes_needed``). A
run whose folder already holds its finished result is skipped (resume); ``--report-only`` rebuilds
the card. The study's configs must use the run-folder convention (a config class of
``KEYS.config_class``: ``results_dir``, ``run_name``, ``default_run_name``, its run identity; and
:func:`flower_apps.common.results.open_run_folder`); the built-in studies keep
their own sweeps for their papers' grids (``python -m flower_apps.<study>.sweep``).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flower_apps.common.sweep import parse_set, run_keys, run_pending, sweep_main, sweep_overrides, sweep_parser


def parse_grid(text: str) -> tuple[str, list[Any]]:
    """``KEY=V1,V2,...`` of ``--grid`` as (key, values); each value read as ``--set`` reads one."""
    import argparse

    key, sep, raw = text.partition("=")
    values = [v.strip() for v in raw.split(",")] if sep else []
    if not key.strip() or not values or any(not v for v in values):
        raise argparse.ArgumentTypeError(f"--grid wants KEY=V1,V2,... with non-empty values, got {text!r}")
    return key.strip(), [parse_set(f"{key}={v}")[1] for v in values]


def grid_runs(grid: Sequence[tuple[str, list[Any]]], seeds: int, seed0: int) -> list[dict[str, Any]]:
    """One dict of run keys per combination of the grid's values and seed (the grid's order, seed last)."""
    keys = [k for k, _ in grid]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"--grid {dup}: given twice; list all its values in one --grid {dup}=V1,V2")
    if "seed" in keys:
        raise ValueError("--grid seed: use --seeds and --seed0")
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    combos = itertools.product(*[values for _, values in grid]) if grid else [()]
    return [{**dict(zip(keys, combo)), "seed": seed0 + s} for combo in combos for s in range(seeds)]


def main(argv: list[str] | None = None) -> int:
    from flower_apps.common.results import run_finished, run_folder
    from flower_apps.config import ConfigError, key_table_of
    from flower_apps.studies import STUDIES

    p = sweep_parser("flower_apps.sweep", __doc__.split("\n")[0], seeds_help="number of seeds (default: 1)")
    p.add_argument("--study", required=True, help="a registered study: " + ", ".join(STUDIES))
    p.add_argument("--preset", default="smoke", help="the study's preset (default: smoke)")
    p.add_argument("--grid", action="append", default=[], type=parse_grid, metavar="KEY=V1,V2",
                   help="a run key and its values; several --grid flags form their product")
    p.add_argument("--list", action="store_true", help="print the runs' names and stop")
    args = p.parse_args(argv)
    if args.study not in STUDIES:
        print(f"error: unknown study {args.study!r}; registered: {', '.join(STUDIES)}", file=sys.stderr)
        return 2
    spec = STUDIES[args.study]
    if args.noise_seed_file:
        args.set.append(("noise-seed-file", args.noise_seed_file))
    out = Path(args.results_dir) / spec.name

    def build() -> list[Any]:
        overrides = sweep_overrides(spec.name, args.preset, args.results_dir, {}, args.set)
        configs = [spec.build_config(run_keys(overrides, run))
                   for run in grid_runs(args.grid, args.seeds or 1, args.seed0)]
        try:  # a config of KEYS.config_class has the run-folder keys (results-dir, run-name) and a run identity
            key_table_of(configs[0])
        except TypeError as exc:
            raise ConfigError(f"study {spec.name!r} does not use run folders ({exc}): "
                              "the generic sweep cannot resume it") from None
        return configs

    def is_complete(cfg: Any) -> bool:
        return run_finished(run_folder(spec.name, cfg), cfg)

    def run(pending: list[Any]) -> None:
        run_pending(pending, spec.server_main, is_complete, nodes=max(spec.nodes_needed(c) for c in pending),
                    num_cpus=args.num_cpus, num_gpus=0.0, describe=describe, engine=args.engine)

    def report(configs: list[Any]) -> str:
        if spec.card is None:
            return f"{spec.name} registers no report card; the runs' summaries are under {out / 'runs'}"
        from flower_apps.common.report_card import write_card

        try:
            return write_card(spec.card, out)
        except FileNotFoundError as exc:
            return f"no report card yet: {exc}"

    return sweep_main(spec.name, args.preset, build, is_complete, run, report, out,
                      report_only=args.report_only, list_only=args.list)


def describe(summary: dict) -> str:
    """A finished run's one line: its scalar results, the accuracy and epsilon first."""
    first = [k for k in ("final_acc", "test_accuracy", "eps", "eps_total") if k in summary]
    rest = [k for k, v in summary.items() if k not in first and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return ", ".join(f"{k} {summary[k]:.4g}" for k in (first + rest)[:4]) or "finished"


if __name__ == "__main__":
    raise SystemExit(main())
