"""Mixnet simulator cost against N: seconds per node-round and peak memory, N = 32 ... 1,024 (issue 40).

    python benchmarks/mixnet_scale.py [--sizes 32 64 128 256 512 1024] [--fragments 7]

Each N runs one round of the paper's workload (benchmarks/mixnet_simulation_speed.py: degree-4 circulant,
K = 2, O = 100, mu = 0.1 s, cover on, F fragments to each neighbour, real Sphinx at every hop) in its own
process, so each peak RSS (ru_maxrss) is that N's alone. Work per node is the same at every N (4
neighbours, O-sized batches), so a simulator linear in N spends the same seconds per node-round at every
N: the fitted exponent of process CPU seconds against N (least squares on log-log) is the growth, and the
target is <= 1.1 with the N = 1,024 round under 2 GiB. CPU seconds, not wall, carry the fit (wall moves
with the machine's load; both are printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_apps.common.results import atomic_write_json

SPEED = Path(__file__).resolve().parent / "mixnet_simulation_speed.py"
SIZES = (32, 64, 128, 256, 512, 1024)
QUICK_SIZES = (32, 128, 512)
TARGET_EXPONENT = 1.1
TARGET_MIB = 2048.0


def one(nodes: int, fragments: int = 7) -> dict:
    """One round at ``nodes`` in a fresh process (its own peak RSS)."""
    cmd = [sys.executable, str(SPEED), "--nodes", str(nodes), "--fragments", str(fragments), "--memory-nodes", "0",
           "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=SPEED.parents[1]).stdout
    return json.loads(out.strip().splitlines()[-1])


def exponent(ns: list[int], ys: list[float]) -> float:
    """Least-squares slope of log y against log n."""
    lx, ly = [math.log(n) for n in ns], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def measure(sizes: tuple[int, ...] = SIZES, fragments: int = 7) -> list[dict]:
    """The benchmark table's rows: per N, CPU and wall seconds per node-round and peak RSS; the fitted growth."""
    runs = [one(n, fragments) for n in sizes]
    rows = []
    for r in runs:
        n = r["nodes"]
        rows.append({"metric": f"mixnet N={n}: process CPU s per node-round (wall {r['wall_s'] / n:.4f}; "
                               f"{r['undelivered']} undelivered)", "value": r["cpu_s"] / n, "reference": None,
                     "ratio": None, "target": None, "met": None})
        rows.append({"metric": f"mixnet N={n}: peak RSS MiB", "value": r["peak_rss_mib"], "reference": None,
                     "ratio": None, "target": TARGET_MIB if n == max(sizes) else None,
                     "met": (r["peak_rss_mib"] < TARGET_MIB) if n == max(sizes) else None, "target_on": "value",
                     "op": "<="})
    growth = exponent([r["nodes"] for r in runs], [r["cpu_s"] for r in runs])
    rows.append({"metric": f"mixnet: growth exponent of CPU s per round in N ({min(sizes)}-{max(sizes)})",
                 "value": growth, "reference": None, "ratio": None, "target": TARGET_EXPONENT,
                 "met": growth <= TARGET_EXPONENT, "target_on": "value", "op": "<="})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--fragments", type=int, default=7)
    p.add_argument("--json", help="also write the rows, with the date and load, to this file (atomically)")
    args = p.parse_args()
    load_start = round(os.getloadavg()[0], 1)
    rows = measure(tuple(args.sizes), args.fragments)
    if args.json:
        atomic_write_json(args.json, {"rows": rows, "run": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(), "sizes": args.sizes,
            "fragments": args.fragments, "load_average_start": load_start,
            "load_average_end": round(os.getloadavg()[0], 1)}})
    for row in rows:
        print(f"{row['metric']}: {row['value']:.4g}" + (f" (target {row['op']} {row['target']:g}: "
                                                         f"{'met' if row['met'] else 'NOT met'})" if row["target"] else ""))


if __name__ == "__main__":
    main()
