"""Time one gradient's full inversion attack on the seed paper's MNIST CNN.

One gradient's full attack = ``dlg`` + ``idlg`` + ``invgrad``, each 400
iterations x 3 restarts (the study's settings). Prints seconds per attack, the
total as a ratio to the 60 s target (ratio < 1 meets it), and a breakdown of
one objective evaluation (forward, first backward with ``create_graph``,
second backward) showing what dominates.

Threads: one attack works on a single image, so each op is tiny and OpenMP
synchronization outweighs intra-op parallelism; on a loaded 2-core machine two
threads were ~50x slower per evaluation than one. The default is therefore one
thread per attack (run several gradients' attacks in parallel processes to use
more cores).

Usage::

    python benchmarks/attacks_bench.py [--threads 1] [--iterations 400] [--restarts 3] [--profile]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from attacks.inversion import (
    AdversaryView,
    InversionConfig,
    bounds_from_normalization,
    capture_single_example_gradient,
    run_attack,
)
from attacks.inversion.metrics import score_reconstruction
from attacks.inversion.objectives import euclidean_distance
from models.seeded_init import seeded_init

TARGET_S = 60.0
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)


class PaperMnistCnn(nn.Module):
    """Conv 1->16, ReLU, pool; conv 16->32, ReLU, pool; FC 1568->128, ReLU, dropout 0.2; FC 128->10."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def synthetic_digit(generator: torch.Generator) -> torch.Tensor:
    """A ring-shaped 28x28 "zero" with slight noise, normalized like MNIST; shape (1, 1, 28, 28)."""
    yy, xx = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    r = torch.sqrt(((xx - 13.5) / 6.0) ** 2 + ((yy - 13.5) / 9.0) ** 2)
    img = torch.exp(-(((r - 1.0) / 0.25) ** 2)) + 0.05 * torch.rand((28, 28), generator=generator)
    return ((img.clamp(0, 1) - MNIST_MEAN[0]) / MNIST_STD[0]).reshape(1, 1, 28, 28)


def eval_breakdown(view: AdversaryView, reps: int = 50) -> dict[str, float]:
    """Milliseconds per phase of one Euclidean-matching objective evaluation."""
    model = PaperMnistCnn()
    model.load_state_dict(view.state_dict)
    model.eval()
    params = list(model.parameters())
    x = torch.randn((1, 1, 28, 28), generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    target = torch.tensor([0])
    t = {"forward": 0.0, "grad_create_graph": 0.0, "objective_backward": 0.0}
    for _ in range(reps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), target)
        t1 = time.perf_counter()
        dummy = torch.autograd.grad(loss, params, create_graph=True)
        t2 = time.perf_counter()
        torch.autograd.grad(euclidean_distance(dummy, view.gradient), [x])
        t3 = time.perf_counter()
        t["forward"] += t1 - t0
        t["grad_create_graph"] += t2 - t1
        t["objective_backward"] += t3 - t2
    return {k: 1e3 * v / reps for k, v in t.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="also print torch.profiler's top ops")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(0)
    with seeded_init(0):
        model = PaperMnistCnn()
    x, y = synthetic_digit(gen), 0
    gradient = capture_single_example_gradient(model, x, y)
    view = AdversaryView(PaperMnistCnn, model.state_dict(), tuple(gradient), (1, 28, 28), 10)
    config = InversionConfig(
        iterations=args.iterations,
        restarts=args.restarts,
        seed=0,
        pixel_bounds=bounds_from_normalization(MNIST_MEAN, MNIST_STD),
    )
    print(f"threads={torch.get_num_threads()} iterations={args.iterations} restarts={args.restarts}")
    total = total_cpu = 0.0
    for name in ("dlg", "idlg", "invgrad"):
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_attack(name, view, config)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        total += dt
        total_cpu += cpu
        s = score_reconstruction(result, x[0], MNIST_MEAN, MNIST_STD, true_label=y)
        print(
            f"{name:8s} {dt:6.2f} s (cpu {cpu:6.2f} s)  evals={result.evaluations:5d}  "
            f"{1e3 * dt / result.evaluations:5.2f} ms/eval  "
            f"label_ok={int(s['label_correct'])}  ssim={s['ssim']:.3f}  psnr={s['psnr']:.1f}"
        )
    print(f"total    {total:6.2f} s (cpu {total_cpu:6.2f} s)  ratio to {TARGET_S:.0f} s target: {total / TARGET_S:.2f}")
    # Wall time includes waiting for a core on a shared machine; CPU time does not.
    b = eval_breakdown(view)
    per_eval = sum(b.values())
    print("one objective evaluation: " + ", ".join(f"{k} {v:.2f} ms ({100 * v / per_eval:.0f}%)" for k, v in b.items()))
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run_attack("idlg", view, InversionConfig(iterations=30, restarts=1))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
