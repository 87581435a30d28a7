"""Learning over the networked transport: the same run with the simulator and with N node processes over TLS.

    python -m flower_apps.unlinkable_dfl.netlearn                 # N = 8, reduced preset, seed 0
    python -m flower_apps.unlinkable_dfl.netlearn --num-clients 8 --num-rounds 5 --seed 0

Both runs go through Flower (ServerApp = the world, ClientApps = the learners) with one
config; only the carrier of the fragments differs: ``simulation`` = the discrete-event
simulator in virtual time, ``network`` = ``mixnet.net_cluster.LocalCluster``, one
OS process per node (real Sphinx packets over TLS on loopback, real seconds). At 100 %
completeness FragFedAvg is order-independent and quantization is seeded per node and
round, so the two accuracies must agree (up to nothing); any shortfall is lost fragments.
Writes ``<results-dir>/unlinkable-dfl/netlearn/N<N>_s<seed>.json`` (atomic) and prints it.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

from flower_apps.common.results import atomic_write_json, read_json
from flower_apps.common.sweep import run_keys, run_pending, sweep_overrides
from flower_apps.unlinkable_dfl.config import UdflConfig, build_config
from flower_apps.unlinkable_dfl.server_app import is_complete, run_dir, server_main

STUDY = "unlinkable-dfl"
CARRIERS = ("simulation", "network")


def configs(num_clients: int, num_rounds: int, seed: int, results_dir: str) -> dict[str, UdflConfig]:
    """One config per carrier, identical but for the run name (so the results do not collide)."""
    overrides = sweep_overrides(STUDY, "reduced", results_dir, {})
    out = {}
    for carrier in CARRIERS:
        run = {"num-clients": num_clients, "num-rounds": num_rounds, "seed": seed, "clients-per-message": num_clients,
               "run-name": f"netlearn-{carrier}-N{num_clients}-T{num_rounds}-s{seed}"}
        out[carrier] = build_config(run_keys(overrides, run))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flower_apps.unlinkable_dfl.netlearn", description=__doc__.split("\n")[0])
    p.add_argument("--num-clients", type=int, default=8)
    p.add_argument("--num-rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results-dir", default="results")
    args = p.parse_args(argv)
    results_dir = str(Path(args.results_dir).resolve())
    cfgs = configs(args.num_clients, args.num_rounds, args.seed, results_dir)
    wall = {}
    for carrier, cfg in cfgs.items():
        t0 = time.perf_counter()
        if not is_complete(cfg):
            run_pending([cfg], functools.partial(server_main, network=carrier == "network"), is_complete, nodes=1,
                        num_cpus=1.0, num_gpus=0.0, engine="inprocess",  # server_main's network= is no run key
                        describe=lambda s: f"final acc {s['final_acc']:.4f}, completeness {s['mean_completeness']:.3f}")
        wall[carrier] = time.perf_counter() - t0
    summaries = {c: read_json(run_dir(cfg) / "summary.json") for c, cfg in cfgs.items()}
    result = {
        "num_nodes": args.num_clients, "num_rounds": args.num_rounds, "seed": args.seed,
        **{f"{c}_{k}": summaries[c][k] for c in CARRIERS
           for k in ("final_acc", "best_acc", "acc_curve", "mean_completeness", "wall_seconds", "networked",
                     "mean_network_virtual_s", "mean_bytes_per_node")},
        "accuracy_difference": summaries["network"]["final_acc"] - summaries["simulation"]["final_acc"],
        "command_wall_s": wall,
    }
    path = Path(results_dir) / STUDY / "netlearn" / f"N{args.num_clients}_T{args.num_rounds}_s{args.seed}.json"
    atomic_write_json(path, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
