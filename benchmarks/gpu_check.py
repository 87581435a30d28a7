"""GPU check: each study's smoke preset through Flower's simulation engine, on CUDA and on CPU.

For dfl-dp (and ultrasound, when flower_apps/ultrasound/study.py exists) it runs the
``smoke`` preset twice in fresh processes, once with ``device='cuda'`` and GPU client
resources (``num_gpus`` per virtual SuperNode, default 0.5) and once with ``device='cpu'``,
and prints:

- the environment (versions, ``torch.cuda`` device name and memory, ``nvidia-smi``);
- whether CUDA was used: the ``cuda`` flag of every ClientApp reply (recorded by a grid
  proxy around the study's own ServerApp logic) and the GPU processes seen by ``nvidia-smi``;
- the time per round (round 1 includes the actors' warm-up; rounds 2+ are reported apart),
  and the CPU/GPU ratio of both.

Usage: ``bash benchmarks/gpu_check.sh`` (budget: 5 minutes on one GPU machine);
``--allow-no-gpu`` runs the CPU half where no GPU exists (to check the harness itself).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere, installed project or not
    sys.path.insert(0, str(REPO))
REQUIRED = ("flwr", "torch", "ray", "numpy", "timm", "opacus", "dp_accounting", "mlxtend")


# ------------------------------------------------------------------------------ one run (child)
class RecordingGrid:
    """Proxy of a Flower Grid that records, per server round, when its messages were pushed,
    when the last reply arrived, and the ``cuda`` flag of every reply's metrics."""

    def __init__(self, grid) -> None:
        self._grid = grid
        self.rounds: dict[int, dict] = {}
        self._round_of: dict[str, int] = {}

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def push_messages(self, messages):
        messages = list(messages)
        ids = list(self._grid.push_messages(messages))
        now = time.perf_counter()
        for msg, mid in zip(messages, ids):
            cfg = msg.content.config_records.get("config") if msg.has_content() else None
            rnd = int(cfg["server-round"]) if cfg is not None and "server-round" in cfg else 0
            r = self.rounds.setdefault(rnd, {"start": now, "end": now, "cuda": [], "errors": 0})
            r["start"] = min(r["start"], now)
            self._round_of[str(mid)] = rnd
        return ids

    def pull_messages(self, message_ids):
        replies = list(self._grid.pull_messages(message_ids))
        now = time.perf_counter()
        for rep in replies:
            r = self.rounds.get(self._round_of.get(rep.metadata.reply_to_message_id, -1))
            if r is None:
                continue
            r["end"] = now
            if rep.has_error():
                r["errors"] += 1
                continue
            for rec in rep.content.metric_records.values():
                if "cuda" in rec:
                    r["cuda"].append(int(rec["cuda"]))
        return replies

    def send_and_receive(self, messages, *, timeout=None):
        ids = set(self.push_messages(messages))
        out, deadline = [], None if timeout is None else time.monotonic() + timeout
        while ids and (deadline is None or time.monotonic() < deadline):
            got = self.pull_messages(ids)
            out += got
            ids -= {m.metadata.reply_to_message_id for m in got}
            time.sleep(0.01)
        return out

    def summary(self, end: float) -> list[dict]:
        """Per round: seconds from its first push to the next round's first push (the last round:
        to ``end``), so aggregation and evaluation count; replies' cuda flags; error replies."""
        rounds = sorted((k, v) for k, v in self.rounds.items() if k > 0)
        starts = [v["start"] for _, v in rounds[1:]] + [end]
        return [{"round": k, "seconds": nxt - v["start"], "cuda": v["cuda"], "errors": v["errors"]}
                for (k, v), nxt in zip(rounds, starts)]


def run_one(study: str, device: str, num_gpus: float, results_dir: str) -> dict:
    """Run the study's smoke preset through the simulation engine; return timings and flags."""
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    from flower_apps.config import RUN_CONFIG_DEFAULTS
    from flower_apps.engine import simulate
    from flower_apps.router import prepare

    overrides = {"study": study, "preset": "smoke", "device": device, "results-dir": results_dir,
                 "run-name": f"gpu-check-{device}"}
    spec, cfg = prepare({**RUN_CONFIG_DEFAULTS, **overrides})
    nodes = max(1, math.ceil(cfg.num_clients / getattr(cfg, "clients_per_message", 1)))
    out: dict = {"study": study, "device": device, "num_supernodes": nodes, "num_gpus": num_gpus}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        rec = RecordingGrid(grid)
        t0 = time.perf_counter()
        spec.server_main(rec, cfg)
        end = time.perf_counter()
        out["server_seconds"] = end - t0
        out["rounds"] = rec.summary(end)

    t0 = time.perf_counter()
    simulate(app, nodes, num_cpus=1, num_gpus=num_gpus)
    out["wall_seconds"] = time.perf_counter() - t0
    if "rounds" not in out:
        raise RuntimeError("the ServerApp did not finish (see the Flower log above)")
    return out


# ------------------------------------------------------------------------------ orchestration
class GpuSampler(threading.Thread):
    """Polls ``nvidia-smi`` for compute processes while a run goes on."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.max_procs, self.max_mib, self._stop = 0, 0, threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                res = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
                rows = [r.split(",") for r in res.stdout.strip().splitlines() if r.strip()]
                self.max_procs = max(self.max_procs, len(rows))
                self.max_mib = max(self.max_mib, sum(int(r[1]) for r in rows if r[1].strip().isdigit()))
            except (OSError, subprocess.SubprocessError):
                return
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()


def environment() -> tuple[list[str], dict]:
    """(missing modules, facts) without importing anything heavy twice."""
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    facts: dict = {"python": sys.version.split()[0], "executable": sys.executable}
    if missing:
        return missing, facts
    import flwr
    import ray
    import torch

    facts.update(flwr=flwr.__version__, torch=torch.__version__, ray=ray.__version__,
                 torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(device_count=torch.cuda.device_count(), device_name=torch.cuda.get_device_name(0),
                     device_memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}")
    try:
        importlib.import_module("flower_apps.router")
    except Exception as exc:  # report any import problem of the project itself
        missing.append(f"flower_apps ({type(exc).__name__}: {exc})")
    return missing, facts


def child(study: str, device: str, num_gpus: float, timeout: float, workdir: Path) -> dict:
    """Run one (study, device) in a fresh process (own Ray instance); never raises."""
    out_json = workdir / f"{study}-{device}.json"
    log = workdir / f"{study}-{device}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", study, device, str(num_gpus),
           str(workdir / "results"), str(out_json)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "FLWR_TELEMETRY_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    sampler = GpuSampler() if device == "cuda" and shutil.which("nvidia-smi") else None
    if sampler:
        sampler.start()
    t0 = time.perf_counter()
    try:
        with open(log, "w") as fh:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
        rc: int | str = proc.returncode  # the exit status, or "timeout"
    except subprocess.TimeoutExpired:
        rc = "timeout"
    finally:
        if sampler:
            sampler.stop()
    res: dict = {"study": study, "device": device, "rc": rc, "process_seconds": time.perf_counter() - t0,
                 "log": str(log)}
    if sampler:
        res.update(gpu_procs=sampler.max_procs, gpu_mib=sampler.max_mib)
    if rc == 0 and out_json.exists():
        res.update(json.loads(out_json.read_text()))
    else:
        res["tail"] = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
    return res


def per_round(res: dict) -> tuple[float | None, float | None]:
    """(round 1 seconds, mean seconds of rounds 2+)."""
    rounds = res.get("rounds") or []
    first = rounds[0]["seconds"] if rounds else None
    later = statistics.fmean(r["seconds"] for r in rounds[1:]) if len(rounds) > 1 else None
    return first, later


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--studies", nargs="+", default=["dfl-dp", "ultrasound"])
    p.add_argument("--num-gpus", type=float, default=0.5, help="GPU fraction per virtual SuperNode")
    p.add_argument("--budget", type=float, default=280, help="seconds for everything (the check must fit 5 min)")
    p.add_argument("--allow-no-gpu", action="store_true", help="without CUDA, still run the CPU half")
    p.add_argument("--workdir", help="default: a temporary directory")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        study, device, num_gpus, results_dir, out_json = args.child
        res = run_one(study, device, float(num_gpus), results_dir)
        Path(out_json).write_text(json.dumps(res))
        return 0

    t_start = time.monotonic()
    print("== environment")
    missing, facts = environment()
    for k, v in facts.items():
        print(f"  {k:18s} {v}")
    if missing:
        print(f"MISSING: {', '.join(missing)}\n  -> run `bash scripts/setup.sh` (or install the project: "
              f"pip install -e .) and rerun with that Python (PYTHON=... bash benchmarks/gpu_check.sh)")
        return 2
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        print(f"  {'nvidia-smi':18s} {smi.stdout.strip() or smi.stderr.strip()}")
    has_gpu = bool(facts.get("cuda_available"))
    if not has_gpu:
        print("NO CUDA: torch.cuda.is_available() is False"
              + (" (torch is a CPU build)" if facts.get("torch_cuda") is None else " (driver/device not visible)"))
        if not args.allow_no_gpu:
            return 1
        print("  --allow-no-gpu: running the CPU half only")

    studies = []
    for s in args.studies:
        pkg = s.replace("-", "_")
        if s != "dfl-dp" and not (REPO / "flower_apps" / pkg / "study.py").exists():
            print(f"== {s}: SKIPPED (flower_apps/{pkg}/study.py does not exist yet)")
            continue
        studies.append(s)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-check-"))
    results: list[dict] = []
    plan = [(s, d) for s in studies for d in (("cuda", "cpu") if has_gpu else ("cpu",))]
    for i, (study, device) in enumerate(plan):
        left = args.budget - (time.monotonic() - t_start)
        if left < 30:
            print(f"== {study} on {device}: SKIPPED (budget of {args.budget:.0f}s used up)")
            continue
        timeout = left - 30 * (len(plan) - i - 1)  # keep 30 s for each run still to come
        print(f"== {study} smoke on {device} (timeout {timeout:.0f}s) ...", flush=True)
        res = child(study, device, args.num_gpus if device == "cuda" else 0.0, timeout, workdir)
        results.append(res)
        if res["rc"] != 0:
            print(f"  FAILED ({res['rc']}); log {res['log']}:\n{res['tail']}")
            continue
        first, later = per_round(res)
        flags = [c for r in res["rounds"] for c in r["cuda"]]
        print(f"  {len(res['rounds'])} rounds on {res['num_supernodes']} virtual SuperNodes, "
              f"round 1 {fmt(first)} s (with warm-up), rounds 2+ {fmt(later)} s/round, "
              f"ServerApp {res['server_seconds']:.1f} s, process {res['process_seconds']:.1f} s")
        if device == "cuda":
            used = bool(flags) and all(flags)
            print(f"  CUDA used by the ClientApps: {'YES' if used else 'NO'} "
                  f"({sum(flags)}/{len(flags)} replies report cuda=1; "
                  f"nvidia-smi saw up to {res.get('gpu_procs', '?')} GPU processes, {res.get('gpu_mib', '?')} MiB)")

    print("== summary")
    if has_gpu:
        print(f"  GPU: {facts.get('device_name')} ({facts.get('device_memory_gib')} GiB, "
              f"compute capability {facts.get('capability')}), torch {facts['torch']} CUDA {facts['torch_cuda']}")
    print(f"  {'study':12s} {'device':6s} {'round 1 s':>10s} {'rounds 2+ s':>12s} {'cuda replies':>13s}")
    ok = True
    for res in results:
        first, later = per_round(res)
        flags = [c for r in res.get("rounds", []) for c in r["cuda"]]
        print(f"  {res['study']:12s} {res['device']:6s} {fmt(first):>10s} {fmt(later):>12s} "
              f"{(str(sum(flags)) + '/' + str(len(flags))) if flags else '-':>13s}"
              + ("" if res["rc"] == 0 else f"  FAILED ({res['rc']})"))
        ok &= res["rc"] == 0 and (res["device"] != "cuda" or (bool(flags) and all(flags)))
    for study in studies:
        by = {r["device"]: r for r in results if r["study"] == study and r["rc"] == 0}
        if "cuda" in by and "cpu" in by:
            (g1, g2), (c1, c2) = per_round(by["cuda"]), per_round(by["cpu"])
            ratio = (lambda c, g: f"{c / g:.2f}x" if c and g else "-")
            print(f"  {study}: CPU/GPU time ratio round 1 {ratio(c1, g1)}, rounds 2+ {ratio(c2, g2)} "
                  "(> 1: the GPU is faster)")
    print(f"  total {time.monotonic() - t_start:.0f} s; logs and results in {workdir}")
    return 0 if ok and (has_gpu or args.allow_no_gpu) else 1


if __name__ == "__main__":
    raise SystemExit(main())
