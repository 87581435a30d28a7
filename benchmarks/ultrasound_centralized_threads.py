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
repetitions. Run it on an otherwise idle machine: another busy process makes the ratio meaningless.
Target: all threads <= 0.75x one thread's wall time on 2 cores (the change earns its place).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_apps.ultrasound.models import create_model  # noqa: E402
from flower_apps.ultrasound.train import train_local  # noqa: E402

TARGET_RATIO = 0.75


def measure(quick: bool = True, arch: str = "efficientnet_lite0", image_size: int = 160, n: int = 64,
            threads: int | None = None, reps: int | None = None) -> list[dict]:
    """Wall seconds of one epoch over ``n`` images on ``threads`` threads over one thread (one row)."""
    reps = reps or (2 if quick else 4)
    threads = threads or os.cpu_count() or 1
    old = torch.get_num_threads()
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (n, image_size, image_size), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 2, (n,), generator=g)
        base = create_model(arch, 2, image_size, dp=False, pretrained=False, weights_dir="", seed=0)[0]
        best = {1: float("inf"), threads: float("inf")}
        for rep in range(reps + 1):  # the first round warms up both (oneDNN primitive caches)
            for t in ((1, threads) if rep % 2 else (threads, 1)):
                torch.set_num_threads(t)
                m = copy.deepcopy(base)
                t0 = time.perf_counter()
                train_local(m, x, y, epochs=1, batch_size=32, lr_for_epoch=lambda e: 1e-3,
                            device=torch.device("cpu"), seed=0, channels_last=True)
                if rep:
                    best[t] = min(best[t], time.perf_counter() - t0)
        ratio = best[threads] / best[1]
        return [{"metric": f"ultrasound_centralized_epoch_{threads}threads_over_1thread_{arch}_{image_size}px",
                 "value": best[threads], "reference": best[1], "ratio": ratio, "target": TARGET_RATIO,
                 "met": ratio <= TARGET_RATIO}]
    finally:
        torch.set_num_threads(old)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="efficientnet_lite0")
    p.add_argument("--image-size", type=int, default=160)
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="default: every core (os.cpu_count())")
    p.add_argument("--reps", type=int, default=4)
    a = p.parse_args(argv)
    for r in measure(False, a.arch, a.image_size, a.images, a.threads, a.reps):
        print(f"{r['metric']}: {r['value']:.2f} wall s, one thread {r['reference']:.2f} wall s, "
              f"ratio {r['ratio']:.2f} (target <= {r['target']}: {'met' if r['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
