"""Dirichlet partition wall time at N = 100 ... 100,000 clients, against numpy's Dirichlet draws alone.

    python benchmarks/partition_scale.py [--alpha 0.5] [--sizes 100 1000 10000 100000] [--old]

Workload: 10 balanced classes, ``max(40,000, 4 N)`` samples (40,000 is the dfl-dp target-train; 4 per
client at N = 10,000 is issue 40's failing setting), min_size 1, seed 0. Per N it prints the
partition's seconds, how it ended (first draw accepted, or the number of draws before the repair),
the reference (one draw's ``rng.dirichlet`` calls, C of them over N clients, timed in the same
run: the least any redraw loop on this generator stream can cost per draw) and the ratio. With
``--old`` it also times one draw of the pre-repair implementation (index lists built every draw;
its 1000 failing draws cost 1000 x that).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets.partition import dirichlet_partition

CLASSES = 10


class _Repairs(logging.Handler):
    """Collects the draw count of the partitioner's repair warning (its args: alpha, draws, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[object] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.draws.append(record.args[1] if isinstance(record.args, tuple) else "?")


def _labels(num_clients: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, CLASSES, max(40_000, 4 * num_clients))


def _old_draw_seconds(labels: np.ndarray, num_clients: int, alpha: float) -> float:
    """One draw of the pre-repair loop body (index lists per client and class, then sorted)."""
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet(alpha * np.ones(num_clients))) * len(idx)).astype(int)[:-1]
        for k, part in enumerate(np.split(idx, cuts)):
            buckets[k].append(part)
    _ = [np.sort(np.concatenate(b)) for b in buckets]
    return time.perf_counter() - t


def measure(sizes: tuple[int, ...] = (100, 1_000, 10_000, 100_000), alpha: float = 0.5,
            old: bool = False) -> list[dict]:
    """One row per N: seconds of :func:`dirichlet_partition`, reference seconds, ratio."""
    import scipy.special  # noqa: F401  the early-stop rule imports it lazily (~1 s): not part of the timing

    rows = []
    for n_clients in sizes:
        labels = _labels(n_clients)
        handler = _Repairs()
        log = logging.getLogger("datasets.partition")
        log.addHandler(handler)
        try:
            t = time.perf_counter()
            parts = dirichlet_partition(labels, n_clients, np.random.default_rng(0), alpha=alpha)
            seconds = time.perf_counter() - t
        finally:
            log.removeHandler(handler)
        assert min(len(p) for p in parts) >= 1 and sum(len(p) for p in parts) == len(labels)
        rng = np.random.default_rng(1)
        t = time.perf_counter()
        for _ in range(CLASSES):
            rng.dirichlet(alpha * np.ones(n_clients))
        reference = time.perf_counter() - t
        row = {"metric": f"dirichlet partition N={n_clients} ({len(labels)} samples, alpha {alpha})",
               "value": seconds, "reference": reference, "ratio": seconds / reference, "target": None,
               "met": None, "ended": f"repaired after {handler.draws[0]} draws" if handler.draws else "accepted a draw"}
        if old:
            row["old_draw_s"] = _old_draw_seconds(labels, n_clients, alpha)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000])
    ap.add_argument("--old", action="store_true", help="also time one draw of the pre-repair loop")
    args = ap.parse_args(argv)
    print(f"{'N':>8} {'samples':>8} {'seconds':>9} {'dirichlet-only s':>17} {'ratio':>8}  how it ended"
          + ("   old draw s (x1000 if it fails)" if args.old else ""))
    for r in measure(tuple(args.sizes), args.alpha, args.old):
        n = int(r["metric"].split("N=")[1].split()[0])
        samples = r["metric"].split("(")[1].split()[0]
        line = f"{n:>8} {samples:>8} {r['value']:>9.3f} {r['reference']:>17.4f} {r['ratio']:>8.1f}  {r['ended']}"
        print(line + (f"   {r['old_draw_s']:.3f}" if args.old else ""))


if __name__ == "__main__":
    main()
