"""Non-DP local training in channels-last layout over the default layout (ultrasound, `us-channels-last`).

    python benchmarks/ultrasound_channels_last.py                         # Lite0, 160 px, batch 32, 2 threads
    python benchmarks/ultrasound_channels_last.py --image-size 96 --threads 1 --reps 5

One "epoch" of :func:`flower_apps.ultrasound.train.train_local` (the client's training loop: input
normalisation, forward, backward, Adam) on random uint8 images with the `cpu` preset's backbone,
once per layout, alternated over repetitions; process CPU time, minimum over repetitions, so the
ratio holds on a loaded shared machine. The two layouts are the same mathematics (the unit test
``test_channels_last_training_takes_the_same_steps`` checks the weights agree), so only the time
differs. Target: channels-last <= 0.9x the default layout's CPU time (the change earns its key).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_apps.ultrasound.models import create_model  # noqa: E402
from flower_apps.ultrasound.train import train_local  # noqa: E402

TARGET_RATIO = 0.9


def measure(quick: bool = True, arch: str = "efficientnet_lite0", image_size: int = 160, n: int = 64,
            threads: int = 2, reps: int | None = None) -> list[dict]:
    """CPU seconds of one epoch over ``n`` images, channels-last over the default layout (one row)."""
    reps = reps or (2 if quick else 4)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (n, image_size, image_size), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 2, (n,), generator=g)
        base = create_model(arch, 2, image_size, dp=False, pretrained=False, weights_dir="", seed=0)[0]
        best = {False: float("inf"), True: float("inf")}
        for rep in range(reps + 1):  # the first round warms up both (oneDNN primitive caches)
            for cl in ((False, True) if rep % 2 else (True, False)):
                m = copy.deepcopy(base)
                t0 = time.process_time()
                train_local(m, x, y, epochs=1, batch_size=32, lr_for_epoch=lambda e: 1e-3,
                            device=torch.device("cpu"), seed=0, channels_last=cl)
                if rep:
                    best[cl] = min(best[cl], time.process_time() - t0)
        ratio = best[True] / best[False]
        return [{"metric": f"ultrasound_channels_last_epoch_over_default_{arch}_{image_size}px",
                 "value": best[True], "reference": best[False], "ratio": ratio, "target": TARGET_RATIO,
                 "met": ratio <= TARGET_RATIO}]
    finally:
        torch.set_num_threads(old)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="efficientnet_lite0")
    p.add_argument("--image-size", type=int, default=160)
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=4)
    a = p.parse_args(argv)
    for r in measure(False, a.arch, a.image_size, a.images, a.threads, a.reps):
        print(f"{r['metric']}: channels-last {r['value']:.2f} CPU s, default {r['reference']:.2f} CPU s, "
              f"ratio {r['ratio']:.2f} (target <= {r['target']}: {'met' if r['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
