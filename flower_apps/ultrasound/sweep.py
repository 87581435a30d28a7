"""Run the ultrasound grid through Flower and report it.

    python -m flower_apps.ultrasound.sweep --grid smoke
    python -m flower_apps.ultrasound.sweep --grid cpu --tasks normal-vs-abnormal --partitions iid --seeds 2
    python -m flower_apps.ultrasound.sweep --grid paper --num-gpus 0.125        # GPU: 8 clients share one GPU
    python -m flower_apps.ultrasound.sweep --grid smoke --methods fedavg --audit  # + one-run DP-SGD audit

A grid is: tasks x partitions x backbones x methods (FedAvg, FedProx, FedAdam, centralized,
local-only) without DP; the FL algorithms again with DP-SGD at the paper's operating point
(C = 1.5, z = 2); and the C x z ablation (Table 15) with FedAvg -- each over seeds. Every run
writes its own folder atomically; a rerun skips finished runs (resume). All pending runs share
one simulation (one Ray start-up). At the end the tables and figures are rebuilt from every
finished run under ``<results-dir>/ultrasound``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from flower_apps.common.sweep import (
    DATA_FLAGS,
    KeyFlag,
    add_key_flags,
    key_knobs,
    parse_set,
    run_keys,
    run_pending,
    sweep_main,
    sweep_overrides,
    sweep_parser,
    unique_runs,
)
from flower_apps.config import ConfigError
from flower_apps.studies import STUDIES
from flower_apps.ultrasound import audit
from flower_apps.ultrasound.config import ALGORITHMS, MODES, UltrasoundConfig, nodes_needed
from flower_apps.ultrasound.gradient_audit import DEFAULT_GRADIENT_CANARIES
from flower_apps.ultrasound.report import write_report
from flower_apps.ultrasound.server_app import is_complete, server_main
from flower_apps.ultrasound.study import KEYS, NOISE_SEED_ENV

METHODS = ("fedavg", "fedprox", "fedadam", "centralized", "local")
PAPER_ABLATION_C = (0.5, 1.0, 1.5, 2.0)
PAPER_ABLATION_Z = (0.5, 1.0, 1.5, 2.0, 3.0)
TASKS3 = ("normal-vs-abnormal", "benign-vs-malignant", "three-class")
# The cpu grid's DP fine-tuning recipe (docs/ultrasound.md, "DP-SGD with noise at the cpu scale").
CPU_DP_RECIPE = (("us-dp-finetune", "frozen-bn-head"), ("us-head-init", "zero"), ("lr", 0.01))


# Flags that set a run key for every run of the sweep (type, choices and help from the key).
KNOBS = (
    KeyFlag("num-rounds", "--rounds"),
    KeyFlag("local-epochs"),
    KeyFlag("us-image-size", "--image-size"),
    *DATA_FLAGS,
    KeyFlag("us-grad-sample-mode", "--grad-sample-mode"),
)
# Flags that give the values of a grid axis (default: the grid's).
AXES = (
    KeyFlag("us-task", "--tasks", axis=True, default="the grid's"),
    KeyFlag("us-partition", "--partitions", axis=True, default="the grid's"),
    KeyFlag("us-arch", "--archs", axis=True, default="the grid's"),
)
ABLATION = (
    KeyFlag("us-max-grad-norm", "--ablation-c", axis=True, note="the C x z ablation's clip norms", default="the grid's"),
    KeyFlag("us-noise-multiplier", "--ablation-z", axis=True, note="the C x z ablation's noise multipliers",
            default="the grid's"),
)
AUDIT_CANARY = KeyFlag("us-audit-canary", "--audit-canary", default="gradient for DP-SGD runs (white-box Dirac "
                       "gradient canaries with a verdict that fires on broken noise, issue 37), random-pixels otherwise "
                       "(input-space canaries, lower bound only)")


@dataclass(frozen=True)
class Grid:
    """A named grid: per-run preset and what to sweep."""

    preset: str
    tasks: tuple[str, ...]
    partitions: tuple[str, ...]
    archs: tuple[str, ...]
    methods: tuple[str, ...]
    dp_methods: tuple[str, ...]  # FL algorithms also run with DP-SGD at dp_point
    dp_point: tuple[float, float]  # (C, z)
    dp_tasks: tuple[str, ...]
    ablation_c: tuple[float, ...]
    ablation_z: tuple[float, ...]
    ablation_arch: str
    seeds: int
    # Run keys of every DP-SGD run (the DP fine-tuning recipe); --dp-set overrides them key by key.
    dp_keys: tuple[tuple[str, object], ...] = ()


GRIDS = {
    # Minutes on 2 cores: every method, DP at the paper's point, a 2-cell ablation (tables and figures).
    "smoke": Grid("smoke", ("normal-vs-abnormal",), ("non-iid",), ("mobilenetv2_100",), METHODS, ("fedavg",),
                  (1.5, 2.0), ("normal-vs-abnormal",), (0.5, 1.5), (2.0,), "mobilenetv2_100", 1),
    # CPU scale (ImageNet-pretrained EfficientNet-Lite0 from its wheel, 160 px, T = 10, E = 3): the paper's
    # structure, DP-SGD on all three tasks (Tables 12-14); minutes per run on 2 cores -- subset it.
    # DP-SGD at the paper's C and z as a DP linear probe from a zero head at lr 1e-2 (docs/ultrasound.md:
    # the paper's form, full fine-tuning from timm's head at lr 1e-3, learns nothing at this scale).
    "cpu": Grid("cpu", TASKS3, ("iid", "non-iid"), ("efficientnet_lite0",), METHODS, ALGORITHMS, (1.5, 2.0),
                TASKS3, PAPER_ABLATION_C, PAPER_ABLATION_Z, "efficientnet_lite0", 3, CPU_DP_RECIPE),
    # The paper (GPU): seven backbones, three tasks, IID and non-IID, DP for every FL algorithm, full ablation.
    "paper": Grid("paper", TASKS3, ("iid", "non-iid"),
                  ("resnet50", "vgg16", "vgg19", "densenet121", "mobilenetv2_100", "vit_small_patch16_224",
                   "coatnet_0_rw_224"), METHODS, ALGORITHMS, (1.5, 2.0), ("normal-vs-abnormal",),
                  PAPER_ABLATION_C, PAPER_ABLATION_Z, "densenet121", 3),
}


def _method_keys(method: str) -> dict:
    if method in ALGORITHMS:
        return {"us-mode": "federated", "us-algorithm": method}
    if method not in MODES:
        raise ConfigError(f"--methods: {method!r} is not a method; allowed: {list(METHODS)}")
    return {"us-mode": method}


def dp_run_keys(args: argparse.Namespace) -> dict:
    """``--dp-set`` pairs as run keys of the DP-SGD runs only (e.g. the DP fine-tuning recipe)."""
    pairs = getattr(args, "dp_set", None) or []
    keys = dict(pairs)
    if len(keys) < len(pairs):
        raise ConfigError("--dp-set: a key is given twice")
    clash = sorted(keys.keys() & {k for k, _ in getattr(args, "set", None) or []})
    if clash:
        raise ConfigError(f"--dp-set {clash[0]}: also given by --set; give it once")
    owned = sorted(keys.keys() & {"us-dp-sgd", "us-max-grad-norm", "us-noise-multiplier", "seed", "us-task",
                                  "us-partition", "us-arch", "us-mode", "us-algorithm"})
    if owned:
        raise ConfigError(f"--dp-set {owned[0]}: the grid sets this key run by run (DP point: --ablation-c/-z)")
    return keys


def run_specs(grid: Grid, args: argparse.Namespace) -> list[dict]:
    """Every run of the grid as overrides (seed-major, No-DP before DP)."""
    tasks = args.tasks or grid.tasks
    parts = args.partitions or grid.partitions
    archs = args.archs or grid.archs
    methods = args.methods or grid.methods
    # the grid's DP recipe, where --set (every run) or --dp-set (DP runs) do not give the key
    given = {k for k, _ in getattr(args, "set", None) or []}
    dp_keys = {**{k: v for k, v in grid.dp_keys if k not in given}, **dp_run_keys(args)}
    specs: list[dict] = []
    seeds = range(args.seed0, args.seed0 + (args.seeds or grid.seeds))
    for seed in seeds:
        for task in tasks:
            for part in parts:
                for arch in archs:
                    base = {"seed": seed, "us-task": task, "us-partition": part, "us-arch": arch}
                    if not getattr(args, "dp_only", False):
                        specs += [{**base, **_method_keys(m), "us-dp-sgd": False} for m in methods]
                    if not args.no_dp and task in grid.dp_tasks:
                        c, z = grid.dp_point
                        specs += [{**base, **_method_keys(m), "us-dp-sgd": True, "us-max-grad-norm": c,
                                   "us-noise-multiplier": z, **dp_keys} for m in grid.dp_methods if m in methods]
            # Table 15's C x z ablation: on the first DP task only (normal vs abnormal), as in the paper
            # (every ablation run is a DP-SGD run: --no-dp skips it too)
            if not (args.no_ablation or args.no_dp) and task == grid.dp_tasks[0] and "fedavg" in methods:
                arch = grid.ablation_arch if not args.archs else args.archs[0]
                part = "non-iid" if "non-iid" in parts else parts[0]  # the ablation runs on one partition
                for c in args.ablation_c or grid.ablation_c:
                    for z in args.ablation_z or grid.ablation_z:
                        specs.append({"seed": seed, "us-task": task, "us-partition": part, "us-arch": arch,
                                      **_method_keys("fedavg"), "us-dp-sgd": True, "us-max-grad-norm": c,
                                      "us-noise-multiplier": z, **dp_keys})
    return specs


def build_configs(args: argparse.Namespace) -> list[UltrasoundConfig]:
    """Validated configs of the grid, duplicates removed (the DP point is also an ablation cell)."""
    grid = GRIDS[args.grid]
    if args.no_dp and getattr(args, "dp_only", False):
        raise ConfigError("--dp-only and --no-dp leave no run; give one of them")
    knobs = sweep_overrides("ultrasound", grid.preset, args.results_dir, {
        # DP-SGD noise is each client's: the file reaches the clients through their environment (set in
        # main), never the run config; the run only asks for seeded noise.
        "us-noise-mode": "seeded" if args.noise_seed_file else None, **key_knobs(args, KNOBS)}, args.set)
    spec = STUDIES["ultrasound"]
    configs = []
    for run in run_specs(grid, args):
        cfg = spec.build_config(run_keys(knobs, run))
        if args.audit and cfg.mode == "federated":  # --audit only sets the run keys (flower_apps/ultrasound/audit.py)
            kind, m = audit_choice(args, cfg.dp_sgd)
            cfg = spec.build_config(run_keys(knobs, {**run, "us-audit-canaries": m, "us-audit-canary": kind}))
            req = audit.AuditRequest.of(cfg)
            assert req is not None  # audit_choice gives at least 2 canaries
            audit.check_auditable(cfg, req)  # refused here, before the simulation starts
        configs.append(cfg)
    return unique_runs("ultrasound", configs)


def audit_choice(args: argparse.Namespace, dp_sgd: bool) -> tuple[str, int]:
    """(canary kind, canaries) of ``--audit [M] [--audit-canary KIND]`` for one run.

    Default kind: white-box gradient canaries for DP-SGD runs (the only kind with a verdict that can
    fire at CPU scale, issue 37), random-pixel images otherwise; default M: the kind's own
    (gradient 256, input-space 32).
    """
    kind = args.audit_canary or ("gradient" if dp_sgd else "random-pixels")
    if args.audit > 0:
        return kind, args.audit
    return kind, DEFAULT_GRADIENT_CANARIES if kind == "gradient" else audit.DEFAULT_CANARIES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = sweep_parser("flower_apps.ultrasound.sweep", __doc__)
    p.add_argument("--grid", choices=sorted(GRIDS), default="smoke")
    add_key_flags(p, KEYS, AXES)
    p.add_argument("--methods", nargs="+", choices=METHODS)
    p.add_argument("--no-dp", action="store_true", help="no DP-SGD run: skips the DP point and the C x z ablation")
    p.add_argument("--no-ablation", action="store_true", help="skip the C x z ablation")
    p.add_argument("--dp-only", action="store_true", help="only the DP-SGD runs (the DP point and the ablation)")
    add_key_flags(p, KEYS, ABLATION)
    p.add_argument("--dp-set", action="append", default=[], type=parse_set, metavar="KEY=VALUE", dest="dp_set",
                   help="a run key for the DP-SGD runs only (repeatable), e.g. the DP fine-tuning recipe "
                        "--dp-set us-dp-finetune=frozen-bn-head --dp-set us-head-init=zero --dp-set lr=0.01")
    add_key_flags(p, KEYS, KNOBS)
    p.add_argument("--num-gpus", type=float, default=None,
                   help="GPUs per virtual SuperNode (default: 1/K with CUDA, so the K clients share one GPU)")
    p.add_argument("--list", action="store_true", help="print the runs and exit")
    p.add_argument("--attacks", action="store_true",
                   help="attack every federated run's final model (MIA with shadow models and offline LiRA; "
                        "DLG / iDLG / InvGrad on single-example and DP-SGD gradients) and write the report card")
    p.add_argument("--audit", type=int, nargs="?", const=-1, default=0, metavar="M",
                   help=f"one-run empirical audit of client {audit.AUDITED_CLIENT} in every federated run, M canaries "
                        f"(default: {DEFAULT_GRADIENT_CANARIES} gradient canaries, {audit.DEFAULT_CANARIES} input-space "
                        "ones): sets the run keys us-audit-canaries / us-audit-canary; audited runs get their own folders")
    add_key_flags(p, KEYS, (AUDIT_CANARY,))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.noise_seed_file:
        # In a sweep on this machine every client is ours: they read the file from their own environment
        # (Ray's workers inherit the driver's). A remote Ray cluster's nodes need the variable set there.
        os.environ[NOISE_SEED_ENV] = args.noise_seed_file
    return sweep_main("ultrasound", args.grid, lambda: build_configs(args), is_complete,
                      lambda p: _run(p, args),
                      lambda configs: write_report(args.results_dir) + _attacks(configs, args),
                      Path(args.results_dir) / "ultrasound",
                      report_only=args.report_only, list_only=args.list)


def _attacks(configs: list[UltrasoundConfig], args: argparse.Namespace) -> str:
    """--attacks: MIA (shadow, loss threshold, offline LiRA) and inversion per federated run, report card."""
    if not args.attacks:
        return ""
    from flower_apps.ultrasound.attacks import attack_phase

    return attack_phase(configs)


def _run(pending: list[UltrasoundConfig], args: argparse.Namespace) -> None:
    import torch

    nodes = max(nodes_needed(c) for c in pending)
    num_gpus = args.num_gpus if args.num_gpus is not None else (1.0 / nodes if torch.cuda.is_available() else 0.0)
    run_pending(pending, server_main, is_complete, nodes=nodes, num_cpus=args.num_cpus,
                num_gpus=num_gpus,
                describe=lambda s: f"acc {s['test_accuracy']:.4f}", engine=args.engine)


if __name__ == "__main__":
    raise SystemExit(main())
