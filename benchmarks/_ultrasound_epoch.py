"""Shared by the ultrasound training benchmarks: one epoch of the client's ``train_local`` per variant.

A variant is ``(torch threads, channels_last)``. Every variant trains a fresh copy of the same
randomly initialised `cpu`-preset backbone on the same random uint8 images; variants alternate in
order over repetitions (a change in load hits them alike), the first repetition only warms up
(oneDNN primitive caches), and each variant's time is its minimum over the later repetitions.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Hashable

import torch

from flower_apps.ultrasound.models import create_model
from flower_apps.ultrasound.train import train_local


def epoch_seconds(variants: dict[Hashable, tuple[int, bool]], *, arch: str, image_size: int, n: int, reps: int,
                  clock: Callable[[], float]) -> dict[Hashable, float]:
    """Best seconds (by ``clock``: ``time.process_time`` or ``time.perf_counter``) of one epoch per variant."""
    old = torch.get_num_threads()
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (n, image_size, image_size), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 2, (n,), generator=g)
        base = create_model(arch, 2, image_size, dp=False, pretrained=False, weights_dir="", seed=0)[0]
        keys = list(variants)
        best = {k: float("inf") for k in keys}
        for rep in range(reps + 1):
            for k in (keys if rep % 2 else keys[::-1]):
                threads, channels_last = variants[k]
                torch.set_num_threads(threads)
                m = copy.deepcopy(base)
                t0 = clock()
                train_local(m, x, y, epochs=1, batch_size=32, lr_for_epoch=lambda e: 1e-3,
                            device=torch.device("cpu"), seed=0, channels_last=channels_last)
                if rep:
                    best[k] = min(best[k], clock() - t0)
        return best
    finally:
        torch.set_num_threads(old)


def parser(doc: str, *, threads: int | None) -> argparse.ArgumentParser:
    """The command line both benchmarks share (``--threads`` default: ``threads``; None = every core)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--arch", default="efficientnet_lite0")
    p.add_argument("--image-size", type=int, default=160)
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--threads", type=int, default=threads,
                   help="torch threads" + (" (default: every core, os.cpu_count())" if threads is None else ""))
    p.add_argument("--reps", type=int, default=4)
    return p
