"""DP-SGD on the classifier of a frozen trunk (`frozen-bn-head`): cached trunk features over running the
whole network at every step (flower_apps/ultrasound/features.py).

    python benchmarks/ultrasound_feature_cache.py                 # Lite0, 160 px, 78 images, E = 3, 2 threads
    python benchmarks/ultrasound_feature_cache.py --rounds 10      # a client's share of the `cpu` grid's run

One client of the `cpu` grid's DP runs: :func:`flower_apps.ultrasound.train.train_local` with DP-SGD
(ghost clipping, C = 1.5, z = 2, batch 32) on ``n`` random uint8 images for ``epochs`` epochs, called
once per round for ``rounds`` rounds on the same trunk (FedAvg hands the frozen trunk back unchanged),
with the cache and without. Process CPU time summed over the rounds; the cached side pays for its
features in its first round (a cache miss), as a client does in a run. Same mathematics
(``test_dp_sgd_on_cached_features_is_the_same_run``), other cost. Target at 3 rounds: <= 0.4x.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_apps.ultrasound import features
from flower_apps.ultrasound.models import create_model
from flower_apps.ultrasound.train import DpSettings, train_local
from privacy.randomness import NoiseSource

TARGET_RATIO = 0.4


def measure(quick: bool = True, arch: str = "efficientnet_lite0", image_size: int = 160, n: int = 78,
            epochs: int = 3, rounds: int | None = None, threads: int = 2) -> list[dict]:
    """CPU seconds of ``rounds`` client trainings with the feature cache over without it (one row)."""
    rounds = rounds or 3
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (n, image_size, image_size), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 2, (n,), generator=g)
        base = create_model(arch, 2, image_size, dp=True, pretrained=False, weights_dir="", seed=0,
                            dp_finetune="frozen-bn-head", head_init="zero")[0]
        cpu = {}
        with tempfile.TemporaryDirectory() as tmp:
            secret = Path(tmp) / "noise-seed"
            secret.write_text("benchmark\n")
            dp = DpSettings(2.0, 1.5, "ghost", noise=NoiseSource(str(secret)))
            for cache in (True, False):
                features.clear_cache()
                t0 = time.process_time()
                for r in range(rounds):
                    m = copy.deepcopy(base)  # the round's global model: same trunk, the aggregated head
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        train_local(m, x, y, epochs=epochs, batch_size=32, lr_for_epoch=lambda e: 1e-2,
                                    device=torch.device("cpu"), seed=r, dp=dp, feature_cache=cache)
                cpu[cache] = time.process_time() - t0
        features.clear_cache()
        ratio = cpu[True] / cpu[False]
        return [{"metric": f"ultrasound_dp_head_feature_cache_over_full_network_{arch}_{image_size}px_{rounds}rounds",
                 "value": cpu[True], "reference": cpu[False], "ratio": ratio, "target": TARGET_RATIO,
                 "met": ratio <= TARGET_RATIO}]
    finally:
        torch.set_num_threads(old)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="efficientnet_lite0")
    p.add_argument("--image-size", type=int, default=160)
    p.add_argument("--images", type=int, default=78)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    for r in measure(False, a.arch, a.image_size, a.images, a.epochs, a.rounds, a.threads):
        print(f"{r['metric']}: cached {r['value']:.2f} CPU s, whole network {r['reference']:.2f} CPU s, "
              f"ratio {r['ratio']:.3f} (target <= {r['target']}: {'met' if r['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
