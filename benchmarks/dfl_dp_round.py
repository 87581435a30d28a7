"""Wall time of one dfl-dp round through Flower vs a plain single-process PyTorch loop.

    python benchmarks/dfl_dp_round.py [--dataset fashion-mnist] [--clients 100] [--rounds 3]

For each framework (FL and sequential DFL, No-DP) it measures, in the same run:
  * plain: the identical local training (same data plan, same clients, same optimizer,
    same batches) in one process, no Flower;
  * flower: the same round through Flower's simulation engine (run_simulation, Ray),
    for several transport settings (logical clients per message, CPUs per virtual node).
It prints per-round seconds (median over rounds 2..R, so actor start-up is excluded),
the ratio flower/plain, and the peak RSS of this process and of its children (Ray workers).
Targets (issue 2): FL ratio <= 1.3, sequential-DFL ratio <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from flower_apps.common.torch_utils import state_to_record  # noqa: E402
from flower_apps.config import RUN_CONFIG_DEFAULTS  # noqa: E402
from flower_apps.dfl_dp.client_app import train as client_train  # noqa: F401,E402  (imported for warm-up parity)
from flower_apps.dfl_dp.data import build_data_plan, data_key  # noqa: E402
from flower_apps.dfl_dp.model import build_model  # noqa: E402
from flower_apps.common.local_training import train_local  # noqa: E402
from flower_apps.common.seeding import client_generator  # noqa: E402
from flower_apps.router import prepare  # noqa: E402


def make_cfg(framework: str, args, cpm: int):
    raw = {**RUN_CONFIG_DEFAULTS, "framework": framework, "dp": False, "num-clients": args.clients,
           "num-rounds": args.rounds, "dataset": args.dataset, "clients-per-message": cpm,
           "results-dir": args.results_dir, "run-name": f"bench_{framework}_cpm{cpm}", "device": "cpu"}
    return prepare(raw)[1]


def plain_rounds(cfg, threads: int) -> list[float]:
    """The same local training as the ClientApp, in one process with ``threads`` torch threads."""
    torch.set_num_threads(threads)
    plan = build_data_plan(data_key(cfg))
    c, h, _ = plan.image_shape
    model = build_model(cfg.seed, c, plan.num_classes, h)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    times = []
    for rnd in range(1, cfg.num_rounds + 1):
        t0 = time.perf_counter()
        models = []
        model.load_state_dict(global_state)
        for cid in range(cfg.num_clients):
            if cfg.framework == "fl":
                model.load_state_dict(global_state)
            x, y = plan.client_data(cid)
            torch.manual_seed(client_generator(cfg.seed, rnd, cid).initial_seed())
            train_local(model, x, y, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                        batch_size=cfg.batch_size, epochs=cfg.local_epochs, grad_clip=cfg.grad_clip,
                        generator=client_generator(cfg.seed, rnd, cid), device=torch.device("cpu"))
            if cfg.framework == "fl":
                models.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        if cfg.framework == "fl":
            global_state = {k: torch.stack([m[k] for m in models]).mean(0) for k in global_state}
        else:
            global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        times.append(time.perf_counter() - t0)
    return times


def flower_rounds(cfg, num_cpus: float) -> list[float]:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    from flower_apps.runner import simulate
    from strategies.cohorts import config_record
    from strategies.registry import build_strategy

    stamps: list[float] = []

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        from dataclasses import asdict

        plan = build_data_plan(data_key(cfg))
        c, h, _ = plan.image_shape
        initial = state_to_record(build_model(cfg.seed, c, plan.num_classes, h))
        strategy = build_strategy(cfg.framework, list(range(cfg.num_clients)), "dfl_dp", cfg.clients_per_message)

        def evaluate_fn(server_round, arrays):
            stamps.append(time.perf_counter())
            return None

        strategy.start(grid, initial, num_rounds=cfg.num_rounds, train_config=config_record(asdict(cfg)),
                       evaluate_fn=evaluate_fn)

    nodes = -(-cfg.num_clients // cfg.clients_per_message)
    simulate(app, nodes, num_cpus=num_cpus)
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="fashion-mnist" if Path("/usr/share/datasets/fashion-mnist").is_dir()
                   else "mnist")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--results-dir", default="/tmp/ppfl-bench")
    p.add_argument("--settings", default="fl:1:1,fl:50:1,fl:100:2,sequential-dfl:1:2,sequential-dfl:100:2",
                   help="framework:clients-per-message:cpus-per-node,...")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    ncpu = os.cpu_count() or 1
    rows = []
    plain: dict[str, float] = {}
    for setting in args.settings.split(","):
        fw, cpm, cpus = setting.split(":")
        cfg = make_cfg(fw, args, int(cpm))
        if fw not in plain:
            # The reference is the faster of the plain loop with 1 thread and with all CPUs' threads.
            n_train = len(build_data_plan(data_key(cfg)).y["target_train"])
            for threads in sorted({1, ncpu}):
                t = plain_rounds(cfg, threads)
                s = statistics.median(t[1:] if len(t) > 1 else t)
                print(f"[plain] {fw}: {s:.2f} s/round ({args.clients} clients, {n_train} samples, "
                      f"{threads} threads)", flush=True)
                plain[fw] = min(plain.get(fw, s), s)
        t = flower_rounds(cfg, min(float(cpus), ncpu))
        fl_t = statistics.median(t[1:] if len(t) > 1 else t)
        rows.append({"framework": fw, "clients_per_message": int(cpm), "cpus_per_node": float(cpus),
                     "plain_s": plain[fw], "flower_s": fl_t, "ratio": fl_t / plain[fw]})
        print(f"[flower] {fw} cpm={cpm} cpus={cpus}: {fl_t:.2f} s/round -> ratio {fl_t / plain[fw]:.2f}", flush=True)
    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print("\n| framework | clients/message | CPUs/node | plain s/round | Flower s/round | ratio | target |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        target = 1.3 if r["framework"] == "fl" else 1.5
        print(f"| {r['framework']} | {r['clients_per_message']} | {r['cpus_per_node']:g} | {r['plain_s']:.2f} | "
              f"{r['flower_s']:.2f} | {r['ratio']:.2f} | <= {target} |")
    print(f"\npeak RSS: this process {self_mb:.0f} MiB, largest child (Ray worker) {child_mb:.0f} MiB; "
          f"dataset {args.dataset}, {ncpu} CPUs, load average {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "peak_rss_mib": {"self": self_mb, "child": child_mb}},
                                              indent=1))


if __name__ == "__main__":
    main()
