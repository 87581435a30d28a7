"""Centralized ultrasound training on all the cores over one thread (wall time, measured in the same run).

    python benchmarks/ultrasound_centralized_threads.py                   # Lite0, 160 px, 64 images, all cores
    python benchmarks/ultrasound_centralized_threads.py --threads 4 --reps 3

The centralized baseline trains in the ServerApp process while the simulation's client actors sit idle.
It used to cap torch at half the cores (to spare cores for Ray); on 2 cores that is one thread, and
the centralized runs of the `cpu` grid took longer alone (1,273 s) than the federated runs of the
same data and epochs (~660 s, two single-thread client actors side by side). This times one epoch of
:func:`flower_apps.ultrasound.train.train_local` (the loop ``_centralized`` runs: channels-last,
Adam, batch 32, the `cpu` preset's backbone) on ``--threads`` threads and on one thread, alternated
over repetitions; **wall** time (more threads spend more CPU time to finish sooner), minimum over
repetitions. Run it on an otherwise idle machine: beside another busy process (load ~2 on 2 cores)
it measured 2 threads at 3.05x one thread's wall time, OpenMP's threads waiting for the core the other
process holds; that is what to expect of a centralized run beside other work (run it with OMP_NUM_THREADS=1).
Target: all threads <= 0.75x one thread's wall time on 2 cores (the change earns its place).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._ultrasound_epoch import epoch_seconds, parser

TARGET_RATIO = 0.75


def measure(quick: bool = True, arch: str = "efficientnet_lite0", image_size: int = 160, n: int = 64,
            threads: int | None = None, reps: int | None = None) -> list[dict]:
    """Wall seconds of one epoch over ``n`` images on ``threads`` threads over one thread (one row)."""
    threads = threads or os.cpu_count() or 1
    best = epoch_seconds({1: (1, True), threads: (threads, True)}, arch=arch, image_size=image_size, n=n,
                         reps=reps or (2 if quick else 4), clock=time.perf_counter)
    ratio = best[threads] / best[1]
    return [{"metric": f"ultrasound_centralized_epoch_{threads}threads_over_1thread_{arch}_{image_size}px",
             "value": best[threads], "reference": best[1], "ratio": ratio, "target": TARGET_RATIO,
             "met": ratio <= TARGET_RATIO}]


def main(argv: list[str] | None = None) -> int:
    a = parser(__doc__, threads=None).parse_args(argv)
    for r in measure(False, a.arch, a.image_size, a.images, a.threads, a.reps):
        print(f"{r['metric']}: {r['value']:.2f} wall s, one thread {r['reference']:.2f} wall s, "
              f"ratio {r['ratio']:.2f} (target <= {r['target']}: {'met' if r['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
