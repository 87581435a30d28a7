"""DP-SGD step time over non-private step time (ultrasound study), measured in the same run.

    python benchmarks/ultrasound_dpsgd_overhead.py                      # smoke image size (32), batch 32, CPU
    python benchmarks/ultrasound_dpsgd_overhead.py --archs mobilenetv2_100 --modes hooks functorch ghost
    python benchmarks/ultrasound_dpsgd_overhead.py --image-size 224 --device cuda

For each backbone: the non-private step (the model as built, BatchNorm included: what a
non-DP run trains), the non-private step of the DP-compatible model (GroupNorm: isolates
the cost of the norm swap), and one DP-SGD step per Opacus grad-sample mode ("hooks":
per-sample gradients from hooks; "functorch": vmap'd per-sample gradients; "ew":
expanded weights; "ghost": ghost clipping, which never materializes per-sample gradients, with
the clipped sum book-kept from its one backward pass; "ghost-2pass": the same with a second backward
pass instead; "ghost-opacus": Opacus' own loss wrapper).
A step = forward, backward, (clip + noise), Adam update on a batch of 32. Variants are timed
round-robin and, on CPU, by process CPU time, so the ratios hold on a loaded shared machine.
Prints seconds per step (minimum over repetitions) and ratios; the target ("Performance at the floor")
is <= 2.0x for the default mode (ghost) on all three backbones at the CPU-scale preset.
:func:`measure` returns the same comparison as rows for the one-table benchmark runner.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_apps.ultrasound.models import ARCHS
from models.seeded_init import seeded_init
from privacy.dpsgd import ghost_clipping_backward, make_opacus_compatible, make_private

DEFAULT_ARCHS = ("mobilenetv2_100", "resnet50", "vit_small_patch16_224")
DEFAULT_MODES = ("hooks", "functorch", "ew", "ghost", "ghost-2pass", "ghost-opacus")
TARGET_RATIO = 2.0  # DP-SGD (ghost) step / non-private step, every default backbone, CPU-scale preset


def build(arch: str, size: int, classes: int = 2) -> nn.Module:
    import timm

    kw: dict[str, Any] = {"img_size": size} if ARCHS[arch].takes_img_size else {}
    with seeded_init(0):
        return timm.create_model(arch, num_classes=classes, **kw)


def interleaved_times(steps: dict[str, Callable[[], object]], warmup: int, reps: int, device: torch.device,
                      clock: str) -> dict[str, list[float]]:
    """Seconds per step of every variant, one entry per repetition, measured round-robin (rep 1 of each,
    rep 2 of each, ...) so that a change in load hits all variants alike. ``clock='cpu'`` counts this
    process's CPU time, ``'wall'`` wall time (CUDA synced)."""
    tick = time.process_time if clock == "cpu" else time.perf_counter
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(reps):
        for name, step in steps.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = tick()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[name].append(tick() - t)
    return times


def interleaved_min_times(steps: dict[str, Callable[[], object]], warmup: int, reps: int, device: torch.device,
                          clock: str) -> dict[str, float]:
    """The minimum over ``reps`` of :func:`interleaved_times` (noise on a shared machine only adds time)."""
    return {k: min(v) for k, v in interleaved_times(steps, warmup, reps, device, clock).items()}


def plain_step_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def dp_step_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mode: str, fast_samplers: bool = True):
    """One DP-SGD step as the study takes it (flower_apps/ultrasound/train.py); 'ghost-2pass' takes the second
    backward pass instead of book keeping; 'ghost-opacus' uses Opacus' own loss wrapper for ghost clipping
    instead of privacy.dpsgd.ghost_clipping_backward."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt = make_private(model, opt, len(y), len(y), noise_multiplier=1.0, max_grad_norm=1.0,
                          grad_sample_mode=mode.split("-")[0], poisson_sampling=False,
                          fast_samplers=fast_samplers)

    def step() -> None:
        if mode in ("ghost", "ghost-2pass"):
            xi = x.detach().requires_grad_(True)
            ghost_clipping_backward(pt.model, nn.functional.cross_entropy(pt.model(xi), y, reduction="none"), xi,
                                    book_keeping=mode == "ghost")
        else:
            pt.criterion(pt.model(x), y).backward()
        pt.optimizer.step()
        pt.optimizer.zero_grad(set_to_none=True)  # frees the per-sample gradients before the next variant runs

    return step


def measure(quick: bool = True, archs: tuple[str, ...] = DEFAULT_ARCHS) -> list[dict]:
    """DP-SGD (ghost, the default mode) step time over the non-private step, per backbone, for the benchmark runner.

    32 px, batch 32, one CPU thread, process CPU time, the two steps interleaved; the value and the
    reference are the minimum over repetitions (5 quick, 11 otherwise, after 2 warm-up steps).

    Returns
    -------
    list of dict
        One row per backbone: metric, value (DP s/step), reference (non-private s/step), ratio, target, met.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 2, (32,), generator=g)
        rows = []
        for arch in archs:
            fixed, _ = make_opacus_compatible(build(arch, 32))
            steps = {"plain": plain_step_fn(build(arch, 32).train(), x, y),
                     "dp": dp_step_fn(fixed.train(), x, y, "ghost")}
            t = interleaved_min_times(steps, 2, 5 if quick else 11, torch.device("cpu"), "cpu")
            ratio = t["dp"] / t["plain"]
            rows.append({"metric": f"dpsgd_ghost_step_over_plain_{arch.split('_patch')[0]}", "value": t["dp"],
                         "reference": t["plain"], "ratio": ratio, "target": TARGET_RATIO, "met": ratio <= TARGET_RATIO})
        return rows
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--archs", nargs="+", default=list(DEFAULT_ARCHS), choices=sorted(ARCHS))
    p.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES), choices=list(DEFAULT_MODES))
    p.add_argument("--image-size", type=int, default=32, help="default: the smoke preset's size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 avoids oversubscription)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--clock", choices=["cpu", "wall"], help="default: cpu time on CPU, wall time on CUDA")
    p.add_argument("--stock-opacus", action="store_true",
                   help="use Opacus' own samplers (make_private(..., fast_samplers=False)) for comparison")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g).to(device)
    y = torch.randint(0, 2, (args.batch_size,), generator=g).to(device)
    clock = args.clock or ("wall" if device.type == "cuda" else "cpu")
    print(f"DP-SGD overhead{' (STOCK Opacus samplers)' if args.stock_opacus else ''}: {args.image_size}px, "
          f"batch {args.batch_size}, {device}, {args.threads} thread(s), "
          f"{clock} clock, min (median) of {args.reps} interleaved steps after {args.warmup} warm-up")
    print(f"{'arch':24s} {'variant':28s} {'s/step':>9s} {'vs non-private':>15s} {'median':>8s}")
    for arch in args.archs:
        steps: dict[str, Callable[[], object]] = {
            "non-private (as built)": plain_step_fn(build(arch, args.image_size).to(device).train(), x, y)}
        fixed, _ = make_opacus_compatible(build(arch, args.image_size))
        fixed = fixed.to(device).train()
        steps["non-private (GroupNorm)"] = plain_step_fn(copy.deepcopy(fixed), x, y)
        for mode in args.modes:
            try:
                steps[f"DP-SGD {mode}"] = dp_step_fn(copy.deepcopy(fixed), x, y, mode, not args.stock_opacus)
                steps[f"DP-SGD {mode}"]()  # a mode Opacus cannot apply fails here: say so, keep going
            except Exception as exc:
                steps.pop(f"DP-SGD {mode}")
                print(f"{arch:24s} {'DP-SGD ' + mode:28s} {'n/a':>9s}   ({type(exc).__name__}: {str(exc)[:60]})",
                      flush=True)
        times = interleaved_times(steps, args.warmup, args.reps, device, clock)
        base, base_med = min(times["non-private (as built)"]), statistics.median(times["non-private (as built)"])
        for name, ts in times.items():
            print(f"{arch:24s} {name:28s} {min(ts):9.4f} {min(ts) / base:14.2f}x "
                  f"{statistics.median(ts) / base_med:7.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
