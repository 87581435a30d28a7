"""Run the tabular-pdp study over seeds (Table III) and the drift demonstration, then report.

    python -m flower_apps.tabular_pdp.sweep                      # reduced: minutes on 2 cores
    python -m flower_apps.tabular_pdp.sweep --grid paper         # 10 seeds x 5 rounds x 100 epochs
    python -m flower_apps.tabular_pdp.sweep --grid reduced --seeds 5 --drift-seeds 10
    python -m flower_apps.tabular_pdp.sweep --grid smoke --audit --drift-seeds 0   # formal vs audited eps
    python -m flower_apps.tabular_pdp.sweep --report-only \
        --real-csv ../shared/data/cancer/global_cancer_patients_2015_2024.partial50k.csv

Two kinds of runs, all in one simulation (one Ray start-up):

* main runs, one per seed: anonymization, drift check, clip estimate, vanilla / GDP / PDP;
* drift-demonstration runs, one per (poison kind, seed): a poisoned client (id = seed mod
  num-clients) and detection only (``tab-settings=''``), for the detection rate and the
  false-positive rate (main runs add clean FPR checks).

Every run writes its own folder atomically; a rerun skips runs whose summary exists for the
same config. The tables and figures are rebuilt from every finished run at the end.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from flower_apps.common.sweep import (
    DATA_FLAGS,
    KeyFlag,
    add_key_flags,
    key_knobs,
    run_keys,
    run_pending,
    sweep_main,
    sweep_overrides,
    sweep_parser,
)
from flower_apps.studies import STUDIES
from flower_apps.tabular_pdp.config import KEYS, STUDY, TabularPdpConfig, nodes_needed
from flower_apps.tabular_pdp.report import write_report
from flower_apps.tabular_pdp.server_app import is_complete, server_main


@dataclass(frozen=True)
class Grid:
    """A named grid: per-run preset, seeds of the main runs, and the drift demonstration."""

    preset: str
    seeds: int
    drift_seeds: int
    poisons: tuple[str, ...] = ("shift-targets", "flip-targets", "scale-features")


GRIDS = {
    # The default: the paper's 5 rounds with 10 local epochs, 3 seeds; 3 attacks x 5 seeds.
    "reduced": Grid("reduced", 3, 5),
    # The paper: 100 local epochs per round, 10 runs.
    "paper": Grid("paper", 10, 10),
    # Tests.
    "smoke": Grid("smoke", 1, 1, ("shift-targets",)),
}
# Flags that set a run key for every run of the sweep (type, choices and help from the key).
KNOBS = (
    KeyFlag("local-epochs", "--epochs"),
    KeyFlag("num-rounds", "--rounds"),
    KeyFlag("tab-clip-norm", "--clip-norm", note="fixes C (tab-clip-mode=fixed) instead of estimating it, e.g. the "
            "paper's 8.5", default="estimated"),
    *(f if f.key != "data-dir" else KeyFlag("data-dir", note="the CSV (or its folder) for --dataset cancer-csv")
      for f in DATA_FLAGS),
    KeyFlag("tab-noise-multiplier", "--noise-multiplier", default="the paper's 0.05"),
)
# The drift demonstration's poison kinds (default: the grid's).
POISON_AXIS = KeyFlag("tab-poison", "--poisons", axis=True, without=("none",), default="the grid's")
AUDIT_CANARIES = 40  # --audit without a number: per client, 20 inserted and 20 held out


def build_configs(args: argparse.Namespace) -> list[TabularPdpConfig]:
    """Every run as a validated config: main runs first, then the drift demonstration."""
    grid = GRIDS[args.grid]
    overrides = sweep_overrides(STUDY, grid.preset, args.results_dir, {
        "noise-seed-file": args.noise_seed_file, **key_knobs(args, KNOBS)}, args.set)
    if args.clip_norm is not None:
        overrides["tab-clip-mode"] = "fixed"
    seeds = range(args.seed0, args.seed0 + (grid.seeds if args.seeds is None else args.seeds))
    drift_seeds = range(args.seed0, args.seed0 + (grid.drift_seeds if args.drift_seeds is None else args.drift_seeds))
    poisons = tuple(args.poisons or grid.poisons)
    audit = {"tab-audit-canaries": args.audit} if args.audit else {}
    runs = [{"seed": s, **audit} for s in seeds]  # the audit measures GDP / PDP: main runs only
    runs += [{"seed": s, "tab-settings": "", "tab-poison": p} for p in poisons for s in drift_seeds]
    spec = STUDIES[STUDY]
    configs = []
    for run in runs:
        flat = run_keys(overrides, run)
        if run.get("tab-poison", "none") != "none":
            flat["tab-poison-client"] = run["seed"] % flat["num-clients"]
        configs.append(spec.build_config(flat))
        if args.attacks and "tab-settings" not in run:  # --attacks: the same run on raw (unanonymized) data
            from flower_apps.tabular_pdp.attacks import raw_data_keys

            configs.append(spec.build_config({**flat, **raw_data_keys(args.results_dir)}))
    return configs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = sweep_parser("flower_apps.tabular_pdp.sweep", __doc__, seeds_help="main runs (default: the grid's)")
    p.add_argument("--grid", choices=sorted(GRIDS), default="reduced")
    p.add_argument("--drift-seeds", type=int, help="runs per poison kind (default: the grid's; 0 = none)")
    add_key_flags(p, KEYS, (POISON_AXIS, *KNOBS))
    p.add_argument("--attacks", action="store_true",
                   help="add a raw-data run per seed, attack every trained model (MIA: shadow-calibrated loss "
                        "threshold, offline LiRA; attribute inference) and write the privacy report card")
    p.add_argument("--audit", type=int, nargs="?", const=AUDIT_CANARIES, default=0, metavar="PER_CLIENT",
                   help=f"empirical privacy audit of GDP and PDP in the main runs with this many canary clients per "
                        f"client (default {AUDIT_CANARIES}, half inserted); audited runs get their own folders")
    p.add_argument("--real-csv", help="also report anonymization on this real partial CSV (e.g. the shared "
                   "50,000-row file; see flower_apps.tabular_pdp.real_table)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.results_dir) / "tabular-pdp"

    def report(configs: list[TabularPdpConfig]) -> str:
        md = write_report(args.results_dir)
        if args.real_csv:
            from flower_apps.tabular_pdp.real_table import partial_table_report, write_partial_report

            md += "\n" + write_partial_report(partial_table_report(args.real_csv), out)
        if args.attacks:
            from flower_apps.tabular_pdp.attacks import attack_phase

            md += attack_phase(configs)
        return md

    return sweep_main(STUDY, args.grid, lambda: build_configs(args), is_complete, lambda p: _run(p, args), report,
                      out, report_only=args.report_only)


def _run(pending: list[TabularPdpConfig], args: argparse.Namespace) -> None:
    def describe(summary: dict) -> str:
        res = ", ".join(f"{k} MAE {v['final_mae']:.3f}" for k, v in summary["settings"].items())
        return f"flagged {summary['drift']['flagged']}{'; ' + res if res else ''}"

    run_pending(pending, server_main, is_complete, nodes=max(nodes_needed(c) for c in pending),
                num_cpus=args.num_cpus, num_gpus=0.0, describe=describe, engine=args.engine)


if __name__ == "__main__":
    raise SystemExit(main())
