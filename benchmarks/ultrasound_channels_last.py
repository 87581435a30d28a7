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

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._ultrasound_epoch import epoch_seconds, parser

TARGET_RATIO = 0.9


def measure(quick: bool = True, arch: str = "efficientnet_lite0", image_size: int = 160, n: int = 64,
            threads: int = 2, reps: int | None = None) -> list[dict]:
    """CPU seconds of one epoch over ``n`` images, channels-last over the default layout (one row)."""
    best = epoch_seconds({False: (threads, False), True: (threads, True)}, arch=arch, image_size=image_size, n=n,
                         reps=reps or (2 if quick else 4), clock=time.process_time)
    ratio = best[True] / best[False]
    return [{"metric": f"ultrasound_channels_last_epoch_over_default_{arch}_{image_size}px",
             "value": best[True], "reference": best[False], "ratio": ratio, "target": TARGET_RATIO,
             "met": ratio <= TARGET_RATIO}]


def main(argv: list[str] | None = None) -> int:
    a = parser(__doc__, threads=2).parse_args(argv)
    for r in measure(False, a.arch, a.image_size, a.images, a.threads, a.reps):
        print(f"{r['metric']}: channels-last {r['value']:.2f} CPU s, default {r['reference']:.2f} CPU s, "
              f"ratio {r['ratio']:.2f} (target <= {r['target']}: {'met' if r['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
