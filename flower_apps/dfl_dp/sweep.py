"""Run the dfl-dp grid (frameworks x conditions x seeds) through Flower and report it.

    python -m flower_apps.dfl_dp.sweep --grid reduced
    python -m flower_apps.dfl_dp.sweep --grid paper --seeds 5
    python -m flower_apps.dfl_dp.sweep --grid protocol-fashion --num-cpus 2   # issue 17's protocol scale
    python -m flower_apps.dfl_dp.sweep --grid appendix-a --num-cpus 2         # the same for T = 200
    python -m flower_apps.dfl_dp.sweep --grid reduced --clients 100 --rounds 10 --data-fraction 0.5
    python -m flower_apps.dfl_dp.sweep --grid audit --audit --results-dir results-audit   # docs/audit.md

Every run writes its own folder atomically; a rerun skips runs whose summary exists for the
same config (resume after an interruption). All pending runs share one simulation (one Ray
start-up). At the end the tables and figures are rebuilt from every finished run.
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
from flower_apps.config import default_nodes
from flower_apps.dfl_dp.config import DflDpConfig
from flower_apps.dfl_dp.report import write_report
from flower_apps.dfl_dp.server_app import is_complete, server_main
from flower_apps.dfl_dp.study import KEYS
from flower_apps.studies import STUDIES


@dataclass(frozen=True)
class Grid:
    """A named grid: per-run preset plus the conditions and seeds to sweep."""

    preset: str
    clip_norms: tuple[float, ...]
    eps_cals: tuple[float, ...]
    seeds: int
    frameworks: tuple[str, ...] = ("fl", "sequential-dfl")
    rounds: int | None = None  # T when the grid differs from its preset (--rounds still wins)


GRIDS = {
    # The README's first command: one DP condition against No-DP, both frameworks, minutes.
    "demo": Grid("reduced", (1.0,), (2.0,), 1),
    # The reduced grid: N = 100 kept (sigma_abs ~ C/N), fewer rounds, two seeds for intervals.
    "reduced": Grid("reduced", (0.1, 1.0), (2.0, 4.0), 2),
    # The paper's grid.
    "paper": Grid("paper", (0.1, 0.5, 1.0, 2.0), (0.5, 1.0, 2.0, 3.0, 4.0), 5),
    # Protocol scale on offline Fashion-MNIST (issue 17): 40,000/5,000/10,000/5,000 split, N = 100,
    # T = 100 (~400 images, 4 SGD steps per client per round), No-DP and C = 1 x eps_cal {1, 2, 4}
    # (the paper's Figure 6b axis), 3 seeds for 95% t-intervals.
    "protocol-fashion": Grid("protocol-fashion", (1.0,), (1.0, 2.0, 4.0), 3),
    # The paper's Appendix A: the same grid trained for T = 200 rounds.
    "appendix-a": Grid("protocol-fashion", (1.0,), (1.0, 2.0, 4.0), 3, rounds=200),
    # Tests.
    "smoke": Grid("smoke", (1.0,), (2.0,), 1),
    # The empirical audit's CPU-scale grid (docs/audit.md): run with --audit. The reduced preset
    # (N = 100, T = 20), C = 1, eps_cal in {2, 8}, one seed; audit-smoke: the same at smoke scale (minutes).
    "audit": Grid("reduced", (1.0,), (2.0, 8.0), 1),
    "audit-smoke": Grid("smoke", (1.0,), (2.0, 8.0), 1),
}
AUDIT_CANARIES = 200  # --audit without a number: 100 inserted, 100 held out


# Flags that set a run key for every run of the sweep (type, choices and help from the key).
KNOBS = (
    KeyFlag("num-clients", "--clients", note="keep 100: sigma_abs scales as C/N"),
    KeyFlag("num-rounds", "--rounds", default="the grid's, else the preset's"),
    *DATA_FLAGS,
    KeyFlag("clients-per-message"),
)
# Flags that give the values of a grid axis (default: the grid's).
AXES = (
    KeyFlag("clip-norm", "--clip-norms", axis=True, default="the grid's"),
    KeyFlag("eps-cal", axis=True, default="the grid's"),
    KeyFlag("framework", "--frameworks", axis=True, default="the grid's"),
)

ATTACK_CLIP_NORM = 1.0
ATTACK_EPS_CAL = (0.5, 1.0, 2.0, 3.0, 4.0)


def is_attacked(cfg: DflDpConfig, args: argparse.Namespace) -> bool:
    """No-DP and C = 1 x eps_cal in {0.5, 1, 2, 3, 4} (the paper's attack conditions)."""
    if not args.attacks or cfg.audit_canaries:  # canary clients shape an audited run's model: no attack target
        return False
    return not cfg.dp or (cfg.clip_norm == args.attack_clip_norm and cfg.eps_cal in tuple(args.attack_eps_cal))


def build_configs(args: argparse.Namespace) -> list[DflDpConfig]:
    """Every run of the grid as a validated config, No-DP first within each seed.

    With ``--attacks``, the attack conditions are added to the grid; their target runs capture
    victim gradients (``capture-victims``), and each gets a shadow run on shadow-train.
    """
    grid = GRIDS[args.grid]
    knobs = key_knobs(args, KNOBS)
    overrides = sweep_overrides("dfl-dp", grid.preset, args.results_dir, {
        "noise-seed-file": args.noise_seed_file, **knobs, "num-rounds": knobs["num-rounds"] or grid.rounds}, args.set)
    clip_norms = tuple(args.clip_norms or grid.clip_norms)
    eps_cals = tuple(args.eps_cal or grid.eps_cals)
    conditions = [{"dp": False}] + [{"dp": True, "clip-norm": c, "eps-cal": e} for c in clip_norms for e in eps_cals]
    if args.attacks:
        for e in args.attack_eps_cal:
            cond = {"dp": True, "clip-norm": args.attack_clip_norm, "eps-cal": e}
            if cond not in conditions:
                conditions.append(cond)
    seeds = range(args.seed0, args.seed0 + (args.seeds or grid.seeds))
    frameworks = tuple(args.frameworks or grid.frameworks)
    configs = []
    spec = STUDIES["dfl-dp"]
    for seed in seeds:
        for fw in frameworks:
            for cond in conditions:
                audit = {"audit-canaries": args.audit} if args.audit and cond["dp"] else {}
                flat = run_keys(overrides, {"seed": seed, "framework": fw, **cond, **audit})
                cfg = spec.build_config(flat)
                if is_attacked(cfg, args):
                    configs.append(spec.build_config({**flat, "capture-victims": args.victims}))
                    configs.append(spec.build_config({**flat, "data-part": "shadow"}))
                else:
                    configs.append(cfg)
    return configs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = sweep_parser("flower_apps.dfl_dp.sweep", __doc__)
    p.add_argument("--grid", choices=sorted(GRIDS), default="reduced")
    add_key_flags(p, KEYS, KNOBS + AXES)
    p.add_argument("--num-gpus", type=float, default=None, help="GPUs per virtual SuperNode (default: 0.5 if CUDA)")
    p.add_argument("--audit", type=int, nargs="?", const=AUDIT_CANARIES, default=0, metavar="CANARIES",
                   help=f"empirical privacy audit of every DP run with this many canary clients (default "
                        f"{AUDIT_CANARIES}, half inserted); audited runs get their own folders (docs/audit.md)")
    a = p.add_argument_group("attacks (membership inference with shadow models, gradient inversion)")
    a.add_argument("--attacks", action="store_true",
                   help="also run both attack families on No-DP and C=1 x eps_cal in {0.5,1,2,3,4}")
    a.add_argument("--attack-clip-norm", type=float, default=ATTACK_CLIP_NORM)
    a.add_argument("--attack-eps-cal", type=float, nargs="+", default=list(ATTACK_EPS_CAL))
    a.add_argument("--victims", type=int, default=3, help="victim gradients per attacked run")
    a.add_argument("--inversion-iters", type=int, default=400)
    a.add_argument("--inversion-restarts", type=int, default=3)
    a.add_argument("--inversion-view", choices=["gradient", "noised-update", "both"], default="gradient")
    a.add_argument("--attack-workers", type=int, default=None, help="processes for the inversion attacks")
    a.add_argument("--lira-references", type=int, default=None,
                   help="offline LiRA reference models per attacked run (default 8; 2 on the smoke grid; 0 = no LiRA)")
    a.add_argument("--lira-epochs", type=int, default=None, help="epochs per reference model (default 5; smoke 1)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def report(configs: list[DflDpConfig]) -> str:
        from flower_apps.dfl_dp.attack_report import write_attack_report

        md = write_report(args.results_dir)
        if args.attacks and not args.report_only:
            return md + "\n" + run_attacks(configs, args)
        return md + "\n" + write_attack_report(args.results_dir)  # from the persisted attack results

    return sweep_main("dfl-dp", args.grid, lambda: build_configs(args), is_complete, lambda p: _run(p, args), report,
                      Path(args.results_dir) / "dfl-dp", report_only=args.report_only)


def shadow_overhead(targets: list[DflDpConfig], shadows: dict) -> str:
    """Wall time of the shadow runs relative to their target runs (the MIA's training overhead)."""
    from flower_apps.common.results import read_json
    from flower_apps.dfl_dp.server_app import run_dir

    t = sum(read_json(run_dir(c) / "summary.json")["wall_seconds"] for c in targets)
    s = sum(read_json(run_dir(shadows[(c.framework, c.condition, c.seed)]) / "summary.json")["wall_seconds"]
            for c in targets)
    return (f"\nShadow-model overhead: {s:.0f} s of shadow training for {t:.0f} s of target training "
            f"(ratio {s / max(t, 1e-9):.2f}; shadow-train is a quarter of target-train's size).\n")


def run_attacks(configs: list[DflDpConfig], args: argparse.Namespace) -> str:
    """The attack phase (after training): MIA per attacked run, inversion per victim; tables, figures."""
    from flower_apps.dfl_dp import attack_eval, attack_report

    targets = [c for c in configs if c.capture_victims and c.data_part == "target"]
    shadows = {(c.framework, c.condition, c.seed): c for c in configs if c.data_part == "shadow"}
    for i, t in enumerate(targets):
        attack_eval.membership_inference(t, shadows[(t.framework, t.condition, t.seed)])
        print(f"[mia {i + 1}/{len(targets)}] {t.default_run_name} done", flush=True)
    refs = args.lira_references if args.lira_references is not None else (2 if args.grid == "smoke" else 8)
    if refs:  # offline LiRA: reference models on the adversary's (shadow) data, no shadow run needed
        from flower_apps.dfl_dp.attack_lira import LiraSettings, lira_for_run

        lira = LiraSettings(num_reference=refs, epochs=args.lira_epochs or (1 if args.grid == "smoke" else 5))
        for i, t in enumerate(targets):
            row = lira_for_run(t, lira)
            print(f"[lira {i + 1}/{len(targets)}] {t.default_run_name}: AUC {row['auc']:.3f}", flush=True)
    views = ["gradient", "noised-update"] if args.inversion_view == "both" else [args.inversion_view]
    for view in views:  # results persist per run; the report below reads them back
        attack_eval.gradient_inversion(targets, view, args.inversion_iters, args.inversion_restarts,
                                       args.attack_workers)
    return attack_report.write_attack_report(args.results_dir) + shadow_overhead(targets, shadows)


def _run(pending: list[DflDpConfig], args: argparse.Namespace) -> None:
    import torch

    num_gpus = args.num_gpus if args.num_gpus is not None else (0.5 if torch.cuda.is_available() else 0.0)
    nodes = max(default_nodes(c) for c in pending)
    run_pending(pending, server_main, is_complete, nodes=nodes, num_cpus=args.num_cpus, num_gpus=num_gpus,
                describe=lambda s: f"final acc {s['final_acc']:.4f}", engine=args.engine)


if __name__ == "__main__":
    raise SystemExit(main())
