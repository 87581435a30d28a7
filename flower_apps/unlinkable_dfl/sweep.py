"""Run one UnlinkableDFL experiment (reduced or paper scale) and write its tables and figures.

    python -m flower_apps.unlinkable_dfl.sweep --experiment scaling
    python -m flower_apps.unlinkable_dfl.sweep --experiment linking --scale paper --seeds 3
    python -m flower_apps.unlinkable_dfl.sweep --experiment content --report-only
    python -m flower_apps.unlinkable_dfl.sweep --experiment scaling --dataset fashion-mnist

Experiments: scaling, cost, payload, partial, churn, byzantine, linking, content, topology
(see docs/unlinkable_dfl.md). ``--dataset`` (scaling, payload, partial) replaces the
scale's dataset; its results go to ``<experiment>-<scale>-<dataset>/``. Learning runs go
through Flower (all pending runs of an experiment share one simulation); network-only
measurements (linking, topology, and the cost experiment's K/O/mu trade-off) replay the
study's traffic through the mixnet simulator, each in a fresh process. Every run writes
its own result atomically; a rerun skips what is done (resume). Tables and figures are
rebuilt from every finished result at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flower_apps.common.results import atomic_write_json, read_json
from flower_apps.common.sweep import (
    KeyFlag,
    add_key_flags,
    key_knobs,
    pending_runs,
    run_keys,
    run_pending,
    sweep_main,
    sweep_overrides,
    sweep_parser,
)
from flower_apps.unlinkable_dfl.config import UdflConfig, build_config, nodes_needed
from flower_apps.unlinkable_dfl.netexp import TrafficSpec
from flower_apps.unlinkable_dfl.server_app import is_complete, run_dir, server_main
from flower_apps.unlinkable_dfl.study import KEYS

STUDY = "unlinkable-dfl"
EXPERIMENTS = ("scaling", "cost", "payload", "partial", "churn", "byzantine", "linking", "content", "topology")
SCALES = ("reduced", "paper")
DATASET_EXPERIMENTS = ("scaling", "payload", "partial")  # the ones --dataset applies to (issue 17)
# The learning runs' data (scaling, payload, partial): type, choices and help from the run keys.
DATA_FLAGS = (
    KeyFlag("dataset", note="of the learning runs (scaling, payload, partial)", default="the scale's preset"),
    KeyFlag("data-dir", note="needs --dataset", default="the loaders' search path"),
    KeyFlag("data-fraction", note="of the --dataset's training images; needs --dataset"),
)
#: Theory columns a transport result must hold; older results without them are measured again.
THEORY_KEYS = ("agnostic_trace_bound", "aware_trace_bound", "aware_relay_h_inf_bits", "agnostic_trace_mult_bound")


@dataclass
class Plan:
    """An experiment at one scale: learning runs (run-config overrides) and transport specs."""

    runs: list[dict] = field(default_factory=list)
    traffic: list[TrafficSpec] = field(default_factory=list)


def _grid(**axes) -> list[dict]:
    out: list[dict] = [{}]
    for key, values in axes.items():
        out = [{**o, key: v} for o in out for v in values]
    return out


TRANSPORTS: dict[str, dict[str, Any]] = {"mixnet": {"udfl-mixnet": True}, "direct": {"udfl-mixnet": False},
              "baseline": {"udfl-mode": "baseline"}}


def plan(experiment: str, scale: str) -> Plan:
    """What an experiment runs at a scale (the reduced scale fits a 2-core machine in minutes)."""
    paper = scale == "paper"
    p = Plan()
    if experiment == "scaling":
        for n in ((8, 16, 32, 64, 100) if paper else (8, 16, 32)):
            for t in TRANSPORTS.values():
                p.runs.append({"num-clients": n, **t, **({} if paper else {"clients-per-message": max(1, n // 2)})})
            # the sender-linking advantage of the same transports (mixnet at the runs' K, O, mu; mixnet off),
            # so that the report card puts each run's accuracy and linking in one row
            p.traffic += [TrafficSpec(num_nodes=n, mixnet=False), TrafficSpec(num_nodes=n, outbox=learning_outbox(scale))]
    elif experiment == "cost":
        for t in TRANSPORTS.values():
            p.runs.append({"num-clients": 32, "udfl-outbox": 100, **t,
                           **({} if paper else {"num-rounds": 2, "clients-per-message": 16})})
        n, outbox = (32, 100) if paper else (16, 100)
        base = TrafficSpec(num_nodes=n, outbox=outbox)
        p.traffic = [TrafficSpec(num_nodes=n, mixnet=False)]
        p.traffic += [TrafficSpec(num_nodes=n, max_hops=k, outbox=outbox) for k in (1, 2, 3)]
        p.traffic += [TrafficSpec(num_nodes=n, outbox=o) for o in (10, 50) if o != base.outbox]
        p.traffic += [TrafficSpec(num_nodes=n, outbox=outbox, mu=m) for m in (0.05, 0.2)]
    elif experiment == "payload":
        p.runs = [{"udfl-quantize": q, **({} if paper else {"udfl-mixnet": False})} for q in (True, False)]
    elif experiment == "partial":
        p.runs = [{"udfl-share-ratio": r} for r in (0.1, 0.25, 0.5, 1.0)]
    elif experiment == "churn":
        p.runs = [{"udfl-churn-leave": c, "udfl-churn-join": 0.5} for c in (0.0, 0.1, 0.25)]
    elif experiment == "byzantine":
        common = {"num-clients": 20, "udfl-topology": "full-mesh", "udfl-krum-budget": 4,
                  **({} if paper else {"udfl-mixnet": False, "clients-per-message": 10})}
        for agg in ("fedavg", "krum"):
            p.runs.append({**common, "udfl-aggregator": agg})
            for attack in ("arbitrary", "scaled"):
                p.runs.append({**common, "udfl-aggregator": agg, "udfl-byzantine-fraction": 0.2,
                               "udfl-byzantine-attack": attack})
    elif experiment == "linking":
        n = 32 if paper else 16
        p.traffic = [TrafficSpec(num_nodes=n, mixnet=False)]
        p.traffic += [TrafficSpec(num_nodes=n, max_hops=k, outbox=o)
                      for k in (1, 2, 3) for o in ((10, 50, 100) if paper else (10, 50))]
        # ... and the learning runs' own configuration (the scale's preset: K = 2, its O), so that the
        # report card can put a learning run's accuracy and its linking advantage in one row
        learn = TrafficSpec(num_nodes=n, outbox=learning_outbox(scale))
        p.traffic += [] if learn in p.traffic else [learn]
    elif experiment == "topology":
        # Supplement: graph degree of the learning topology (circulant; full mesh = degree N - 1),
        # learning with the mixnet on, and the passive adversary's linking on the same graphs.
        n = 32 if paper else 16
        degrees = (2, 4, 8, 16) if paper else (2, 4, 8)
        p.runs = [{"num-clients": n, "udfl-degree": d} for d in degrees]
        p.runs.append({"num-clients": n, "udfl-topology": "full-mesh"})
        p.traffic = [TrafficSpec(num_nodes=n, degree=d, outbox=100 if paper else 50,
                                 fragments_per_peer=7 if paper else 3) for d in degrees]
    elif experiment == "content":
        extra = {} if paper else {"num-clients": 8, "num-rounds": 4, "clients-per-message": 8}
        p.runs = [{"udfl-alpha": a, "udfl-share-ratio": r, "udfl-mixnet": False, "udfl-curious-node": 0, **extra}
                  for a in (0.1, 1.0, 10.0) for r in (0.1, 0.25, 0.5, 1.0)]
    else:
        raise ValueError(f"experiment must be one of {EXPERIMENTS}, got {experiment!r}")
    return p


def learning_outbox(scale: str) -> int:
    """O of the scale's learning runs (its preset, else the key's default)."""
    from flower_apps.unlinkable_dfl.config import PRESETS
    from flower_apps.unlinkable_dfl.study import KEYS

    return int(PRESETS[scale].get("udfl-outbox", KEYS.defaults()["udfl-outbox"]))


def build_configs(runs: list[dict], scale: str, seeds: range, results_dir: str,
                  data: dict | None = None, sets: Sequence[tuple[str, object]] = ()) -> list[UdflConfig]:
    """Validated configs: defaults < the scale's preset < the sweep's data knobs and ``--set`` < the experiment's knobs."""
    overrides = sweep_overrides(STUDY, scale, results_dir, data or {}, sets)
    return [build_config(run_keys(overrides, {**run, "seed": seed})) for seed in seeds for run in runs]


def traffic_path(results_dir: str, spec: TrafficSpec) -> Path:
    key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:12]
    return Path(results_dir) / "unlinkable-dfl" / "transport" / f"{key}.json"


def run_traffic_specs(specs: list[TrafficSpec], results_dir: str, label: str) -> None:
    """The network-only measurements not done yet, each in a fresh process, each written atomically."""
    from flower_apps.unlinkable_dfl.netexp import measure_isolated

    for spec in pending_runs(STUDY, label, specs, lambda s: traffic_done(results_dir, s),
                             noun="transport measurements"):
        t0 = time.perf_counter()
        (row,) = measure_isolated([spec])
        atomic_write_json(traffic_path(results_dir, spec), {"spec": asdict(spec), "result": row})
        print(f"  transport {spec.label} N={spec.num_nodes} seed {spec.seed}: linking acc "
              f"{row['agnostic_accuracy']:.3f} (baseline {row['agnostic_baseline']:.3f}) "
              f"[{time.perf_counter() - t0:.0f}s]", flush=True)


def traffic_done(results_dir: str, spec: TrafficSpec) -> bool:
    """A finished transport measurement that already carries the theory columns."""
    path = traffic_path(results_dir, spec)
    return path.is_file() and all(k in read_json(path)["result"] for k in THEORY_KEYS)


def check_dataset(experiment: str, dataset: str | None, data_dir: str | None) -> None:
    """Refuse ``--dataset`` where it does not apply, and a dataset whose files are absent, before any run."""
    if dataset is None:
        if data_dir is not None:
            raise ValueError("--data-dir needs --dataset")
        return
    if experiment not in DATASET_EXPERIMENTS:
        raise ValueError(f"--dataset applies to the experiments {DATASET_EXPERIMENTS}, not {experiment!r}")
    from datasets.registry import load_dataset

    load_dataset(dataset, data_dir)  # DataError names the missing files (e.g. CIFAR-10 not downloaded)


def run_learning(pending: list[UdflConfig], num_cpus: float = 1.0, engine: str | None = None) -> None:
    """The pending learning runs (``engine``: see :func:`flower_apps.common.sweep.run_pending`)."""
    nodes = max(nodes_needed(c) for c in pending)
    run_pending(pending, server_main, is_complete, nodes=nodes, num_cpus=num_cpus, num_gpus=0.0,
                describe=lambda s: f"final acc {s['final_acc']:.4f}, completeness {s['mean_completeness']:.3f}",
                engine=engine)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = sweep_parser("flower_apps.unlinkable_dfl.sweep", __doc__, seeds_help="number of seeds", default=1)
    p.add_argument("--experiment", choices=EXPERIMENTS, required=True)
    p.add_argument("--scale", choices=SCALES, default="reduced")
    add_key_flags(p, KEYS, DATA_FLAGS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results_dir = str(Path(args.results_dir).resolve())
    seeds = range(args.seed0, args.seed0 + args.seeds)
    p = plan(args.experiment, args.scale)
    specs = [TrafficSpec(**{**asdict(s), "seed": seed}) for seed in seeds for s in p.traffic]
    label = f"{args.experiment}-{args.scale}" + (f"-{args.dataset}" if args.dataset else "")
    try:
        check_dataset(args.experiment, args.dataset, args.data_dir)
    except Exception as exc:  # DataError / ValueError: one clear line before any work
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.data_fraction is not None and args.dataset is None:
        print("error: --data-fraction needs --dataset", file=sys.stderr)
        return 2
    data = key_knobs(args, DATA_FLAGS)

    def report(configs: list[UdflConfig]) -> str:
        from flower_apps.unlinkable_dfl.report import write_report

        paths = [run_dir(c) / "summary.json" for c in configs]
        summaries = [read_json(p) for p in paths if p.is_file()]
        traffic = [read_json(traffic_path(results_dir, s))["result"] for s in specs
                   if traffic_path(results_dir, s).is_file()]
        return write_report(args.experiment, args.scale, summaries, traffic, Path(results_dir) / STUDY,
                            label=label)

    # Two phases: the network-only measurements (``before``), then the learning runs through Flower.
    return sweep_main(STUDY, label, lambda: build_configs(p.runs, args.scale, seeds, results_dir, data, args.set), is_complete,
                      lambda pending: run_learning(pending, args.num_cpus, args.engine), report,
                      Path(results_dir) / STUDY / label,
                      report_only=args.report_only,
                      before=(lambda configs: run_traffic_specs(specs, results_dir, label)) if specs else None)


if __name__ == "__main__":
    raise SystemExit(main())
