"""Wall time of one dfl-dp round through Flower vs a plain single-process PyTorch loop.

    python benchmarks/dfl_dp_round.py [--dataset fashion-mnist] [--clients 100] [--rounds 3]
    python benchmarks/dfl_dp_round.py --quick --settings sequential-dfl:1:2 --profile /tmp/prof

For each framework (FL and sequential DFL, No-DP) it measures, in the same run:
  * plain: the identical local training (same data plan, same clients, same optimizer,
    same batches) in one process, no Flower;
  * flower: the same round through Flower's simulation engine, in-process (flower_apps.engine: the
    HopProbe and the cProfile wrap this process's grid and ServerApp, which flwr run cannot host; Ray),
    for several transport settings (logical clients per message, CPUs per virtual node).
It prints per-round seconds (median over rounds 2..R, so actor start-up is excluded; the plain
reference measured before and after the Flower runs, the faster kept),
the ratio flower/plain, and the peak RSS of this process and of its children (Ray workers).
For sequential DFL with one client per message it also splits each hop of rounds 2..R into
where the time went (:class:`HopProbe`), and ``--profile`` writes a cProfile of the ServerApp.
Targets (issue 2): FL ratio <= 1.3, sequential-DFL ratio <= 1.5.
``--quick`` (25 clients on a quarter of the data: the same ~400 images per client, so the same
per-hop work as the full setting) is what :func:`measure` runs for ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from datasets.image_plan import build_image_plan
from flower_apps.common.local_training import train_local
from flower_apps.common.torch_utils import record_to_state, state_to_record
from flower_apps.config import RUN_CONFIG_DEFAULTS
from flower_apps.dfl_dp.data import data_key
from flower_apps.router import prepare
from models.seeded_init import seeded_init
from models.small_cnn import build_small_cnn
from registry import streams

if TYPE_CHECKING:  # flwr is imported where the Flower rounds run
    from flwr.app import Message

TARGETS = {"fl": 1.3, "sequential-dfl": 1.5}
FULL = {"clients": 100, "data_fraction": 1.0, "rounds": 3}
QUICK = {"clients": 25, "data_fraction": 0.25, "rounds": 3}  # same images per client as FULL
QUICK_SETTINGS = "fl:1:1,sequential-dfl:1:2"


def default_dataset() -> str:
    return "fashion-mnist" if Path("/usr/share/datasets/fashion-mnist").is_dir() else "mnist"


def make_cfg(framework: str, args, cpm: int):
    raw = {**RUN_CONFIG_DEFAULTS, "framework": framework, "dp": False, "num-clients": args.clients,
           "num-rounds": args.rounds, "dataset": args.dataset, "clients-per-message": cpm,
           "data-fraction": args.data_fraction,
           "results-dir": args.results_dir, "run-name": f"bench_{framework}_cpm{cpm}", "device": "cpu"}
    return prepare(raw)[1]


def plain_rounds(cfg, threads: int) -> list[float]:
    """The same local training as the ClientApp, in one process with ``threads`` torch threads."""
    torch.set_num_threads(threads)
    plan = build_image_plan(data_key(cfg))
    c, h, _ = plan.image_shape
    model = build_small_cnn(cfg.seed, c, plan.num_classes, h)
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
            with seeded_init(streams.seed_int("clients.sgd", cfg.seed, rnd, cid)):  # as the ClientApp does
                train_local(model, x, y, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                            batch_size=cfg.batch_size, epochs=cfg.local_epochs, grad_clip=cfg.grad_clip,
                            generator=streams.torch_generator("clients.sgd", cfg.seed, rnd, cid),
                            device=torch.device("cpu"))
            if cfg.framework == "fl":
                models.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        if cfg.framework == "fl":
            global_state = {k: torch.stack([m[k] for m in models]).mean(0) for k in global_state}
        else:
            global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        times.append(time.perf_counter() - t0)
    return times


class HopProbe:
    """A Grid view that timestamps every push and every reply, for the per-hop split.

    Composition, like strategies.base.FastGrid: the strategy's own grid view (the relay) wraps
    this one, so the probe sees exactly the pushes and pulls the transport makes. The other
    stamps come from the messages themselves: ``delivered_at`` (set on the stored instruction
    when the simulation engine hands it to a node) and the reply's ``created_at`` and
    ``train-seconds`` (measured by the ClientApp).
    """

    def __init__(self, grid) -> None:
        self._grid = grid
        self.pushed: dict[str, tuple[float, Message]] = {}  # message id -> (time, message)
        self.replies: list[tuple[float, float, Message]] = []  # (seen, previous empty pull, reply)
        self.pulls = 0
        self._last_pull = 0.0

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def push_messages(self, messages):
        messages = list(messages)
        now = time.time()
        ids = list(self._grid.push_messages(messages))
        for mid, msg in zip(ids, messages):
            self.pushed[mid] = (now, msg)
        return ids

    def pull_messages(self, message_ids):
        got = list(self._grid.pull_messages(message_ids))
        now = time.time()
        self.pulls += 1
        for reply in got:
            self.replies.append((now, self._last_pull, reply))
        self._last_pull = now
        return got

    def hops(self) -> list[dict[str, float]]:
        """Per hop, in ms: the stages between one push and the next (the relay's critical path)."""
        out = []
        for i, (seen, prev_pull, reply) in enumerate(self.replies):
            t_push, msg = self.pushed[reply.metadata.reply_to_message_id]
            delivered = datetime.fromisoformat(msg.metadata.delivered_at).timestamp()
            created = reply.metadata.created_at
            train_s = float(cast("int | float", reply.content["metrics"]["train-seconds"]))  # a MetricRecord value
            nxt = self.replies[i + 1] if i + 1 < len(self.replies) else None
            t_next = self.pushed[nxt[2].metadata.reply_to_message_id][0] if nxt else None
            out.append({
                "push->node pickup": delivered - t_push,
                "pickup->ClientApp": created - train_s - delivered,
                "ClientApp train()": train_s,
                "reply->ServerApp": seen - created,
                "  of which last poll gap": seen - prev_pull,
                "ServerApp turn": (t_next - seen) if t_next is not None else float("nan"),
                "hop": (t_next - t_push) if t_next is not None else float("nan"),
            })
        return [{k: 1e3 * v for k, v in h.items()} for h in out]


def flower_rounds(cfg, num_cpus: float, probe_hops: bool = False,
                  profile: Path | None = None) -> tuple[list[float], list[dict[str, float]]]:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    from flower_apps.engine import simulate
    from strategies.cohorts import config_record
    from strategies.registry import build_strategy

    stamps: list[float] = []
    hops: list[dict[str, float]] = []

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        from dataclasses import asdict

        plan = build_image_plan(data_key(cfg))
        c, h, _ = plan.image_shape
        initial = state_to_record(build_small_cnn(cfg.seed, c, plan.num_classes, h))
        strategy = build_strategy(cfg.framework, list(range(cfg.num_clients)), "dfl_dp", cfg.clients_per_message)
        probe = HopProbe(grid) if probe_hops else None
        prof = cProfile.Profile() if profile else None

        def evaluate_fn(server_round, arrays):
            stamps.append(time.perf_counter())
            if probe is not None and server_round == 1:  # rounds 2..R only: actor start-up excluded
                probe.replies.clear()
            if prof is not None and server_round == cfg.num_rounds:
                prof.disable()
            elif prof is not None and server_round == 1:
                prof.enable()
            return None

        # a HopProbe is a Grid by composition (__getattr__ forwards the rest)
        strategy.start(cast(Grid, probe or grid), initial, num_rounds=cfg.num_rounds, train_config=config_record(asdict(cfg)),
                       evaluate_fn=evaluate_fn)
        if probe is not None:
            hops.extend(probe.hops())
        if prof is not None:
            prof.dump_stats(str(profile))

    nodes = -(-cfg.num_clients // cfg.clients_per_message)
    simulate(app, nodes, num_cpus=num_cpus)
    return [b - a for a, b in zip(stamps, stamps[1:])], hops


def serialization_ms(cfg, threads: int, reps: int = 50) -> dict[str, float]:
    """Median ms of the model's trips through the ArrayRecord, as one hop does them (threads as the actor)."""
    torch.set_num_threads(threads)
    plan = build_image_plan(data_key(cfg))
    c, h, _ = plan.image_shape
    model = build_small_cnn(cfg.seed, c, plan.num_classes, h)
    rec = state_to_record(model)
    steps = {"state_to_record": lambda: state_to_record(model),
             "record_to_state": lambda: record_to_state(rec),
             "build_model": lambda: build_small_cnn(cfg.seed, c, plan.num_classes, h),
             "load_state_dict": lambda: model.load_state_dict(record_to_state(rec))}
    out = {}
    for name, fn in steps.items():
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = 1e3 * statistics.median(ts)
    return out


def hop_table(hops: list[dict[str, float]]) -> str:
    keys = list(hops[0])
    lines = ["| stage (ms per hop) | median | mean | min | max |", "|---|---|---|---|---|"]
    for k in keys:
        v = [h[k] for h in hops if h[k] == h[k]]
        lines.append(f"| {k} | {statistics.median(v):.1f} | {statistics.fmean(v):.1f} | {min(v):.1f} | {max(v):.1f} |")
    return "\n".join(lines)


def plain_reference(cfg, args, ncpu: int) -> float:
    """Median s/round (rounds 2..R) of the faster of the plain loop with 1 thread and with all CPUs' threads."""
    n_train = len(build_image_plan(data_key(cfg)).y["target_train"])
    best = float("inf")
    for threads in sorted({1, ncpu}):
        t = plain_rounds(cfg, threads)
        s = statistics.median(t[1:] if len(t) > 1 else t)
        print(f"[plain] {cfg.framework}: {s:.2f} s/round ({args.clients} clients, {n_train} samples, "
              f"{threads} threads)", flush=True)
        best = min(best, s)
    return best


def run(args) -> list[dict]:
    """Measure every setting in ``args.settings``; one dict per setting (plain and Flower s/round, ratio).

    The plain reference is measured before the Flower runs and again after them, and the faster
    kept: load from other processes only ever slows a measurement, and a spike during the
    reference alone would flatter the ratio.
    """
    ncpu = os.cpu_count() or 1
    rows = []
    plain: dict[str, float] = {}
    cfgs = {}
    for setting in args.settings.split(","):
        fw, cpm, cpus = setting.split(":")
        cfg = make_cfg(fw, args, int(cpm))
        if fw not in plain:
            plain[fw], cfgs[fw] = plain_reference(cfg, args, ncpu), cfg
        probe = fw == "sequential-dfl" and int(cpm) == 1
        profile = Path(args.profile) / f"server_{fw}_cpm{cpm}_cpus{cpus}.prof" if args.profile and probe else None
        t, hops = flower_rounds(cfg, min(float(cpus), ncpu), probe_hops=probe, profile=profile)
        fl_t = statistics.median(t[1:] if len(t) > 1 else t)
        row = {"framework": fw, "clients_per_message": int(cpm), "cpus_per_node": float(cpus),
               "plain_s": plain[fw], "flower_s": fl_t, "ratio": fl_t / plain[fw]}
        print(f"[flower] {fw} cpm={cpm} cpus={cpus}: {fl_t:.2f} s/round -> ratio {fl_t / plain[fw]:.2f}", flush=True)
        if hops:
            row["hop_ms"] = {k: statistics.median([h[k] for h in hops if h[k] == h[k]]) for k in hops[0]}
            row["plain_client_ms"] = 1e3 * plain[fw] / args.clients
            row["serialization_ms"] = serialization_ms(cfg, int(min(float(cpus), ncpu)))
            print(f"\nper hop, rounds 2..{args.rounds} ({len(hops)} hops); plain loop: "
                  f"{row['plain_client_ms']:.1f} ms per client\n{hop_table(hops)}")
            print("in-process, same threads: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row["serialization_ms"].items()))
        if profile:
            s = io.StringIO()
            pstats.Stats(str(profile), stream=s).sort_stats("cumulative").print_stats(18)
            print(f"\ncProfile of the ServerApp thread, rounds 2..{args.rounds} ({profile}):\n" + s.getvalue())
        rows.append(row)
    for fw, cfg in cfgs.items():
        plain[fw] = min(plain[fw], plain_reference(cfg, args, ncpu))
    for row in rows:
        row["plain_s"] = plain[row["framework"]]
        row["ratio"] = row["flower_s"] / row["plain_s"]
        if "plain_client_ms" in row:
            row["plain_client_ms"] = 1e3 * row["plain_s"] / args.clients
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default=default_dataset())
    p.add_argument("--clients", type=int)
    p.add_argument("--data-fraction", type=float)
    p.add_argument("--rounds", type=int)
    p.add_argument("--quick", action="store_true", help=f"{QUICK} instead of {FULL}")
    p.add_argument("--results-dir", default="/tmp/ppfl-bench")
    p.add_argument("--settings", default="fl:1:1,fl:50:1,fl:100:2,sequential-dfl:1:2,sequential-dfl:100:2",
                   help="framework:clients-per-message:cpus-per-node,...")
    p.add_argument("--profile", help="folder for a cProfile of the ServerApp (sequential DFL, 1 client per message)")
    p.add_argument("--json", help="also write the results here")
    return p


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    for k, v in (QUICK if args.quick else FULL).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def measure(quick: bool = True) -> list[dict]:
    """The FL and one-message-per-hop sequential-DFL ratios as rows for ``python -m benchmarks``.

    Returns
    -------
    list of dict
        ``{metric, value, reference, ratio, target, met}``: value = Flower s/round, reference = the
        plain loop's s/round in the same run, target on the ratio.
    """
    args = resolve_args(parser().parse_args(["--settings", QUICK_SETTINGS] + (["--quick"] if quick else [])))
    rows = []
    for r in run(args):
        target = TARGETS[r["framework"]]
        rows.append({"metric": f"dfl-dp round, {r['framework']}, {r['clients_per_message']} client/message, "
                               f"{r['cpus_per_node']:g} CPU/node [Flower s / plain s]",
                     "value": r["flower_s"], "reference": r["plain_s"], "ratio": r["ratio"], "target": target,
                     "met": r["ratio"] <= target})
    return rows


def main() -> None:
    args = resolve_args(parser().parse_args())
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    load_start = round(os.getloadavg()[0], 1)
    rows = run(args)
    ncpu = os.cpu_count() or 1
    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print("\n| framework | clients/message | CPUs/node | plain s/round | Flower s/round | ratio | target |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['framework']} | {r['clients_per_message']} | {r['cpus_per_node']:g} | {r['plain_s']:.2f} | "
              f"{r['flower_s']:.2f} | {r['ratio']:.2f} | <= {TARGETS[r['framework']]} |")
    print(f"\npeak RSS: this process {self_mb:.0f} MiB, largest child (Ray worker) {child_mb:.0f} MiB; "
          f"dataset {args.dataset}, {args.clients} clients, data-fraction {args.data_fraction}, {ncpu} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "rows": rows, "peak_rss_mib": {"self": self_mb, "child": child_mb},
            "run": {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpus": ncpu,
                    "load_average_start": load_start, "load_average_end": round(os.getloadavg()[0], 1),
                    "dataset": args.dataset, "clients": args.clients, "data_fraction": args.data_fraction,
                    "rounds": args.rounds, "settings": args.settings}}, indent=1))


if __name__ == "__main__":
    main()
