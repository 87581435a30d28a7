"""A client's local training and evaluation on in-memory tensors (dfl-dp, unlinkable-dfl, tabular-pdp).

:func:`run_epochs` is the loop (shuffled mini-batches from an explicit generator, optional
gradient-norm clipping); :func:`train_local` is SGD + cross-entropy on it (seed paper,
Sec. 3.2; UnlinkableDFL's learner), :func:`evaluate` its accuracy and mean loss. The
ultrasound study's DP-SGD / FedProx loop has its own module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class EpochStats:
    """What :func:`run_epochs` did: mean loss over every example seen, of the last epoch, and the count."""

    mean_loss: float
    last_epoch_loss: float
    examples: int


def run_epochs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer, loss_fn: nn.Module,
               *, batch_size: int, epochs: int, generator: torch.Generator, device: torch.device | None = None,
               grad_clip: float | None = None) -> EpochStats:
    """``epochs`` passes over (x, y) in ``generator``'s order (``torch.randperm`` on the CPU).

    ``device``: batches are moved there (``x`` may also already live there). ``grad_clip``:
    ``clip_grad_norm_`` of all parameters before each step (None: no clipping).
    """
    model.train()
    n = len(x)
    total, seen, last = 0.0, 0, float("nan")
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        if order.device != x.device:
            order = order.to(x.device)
        epoch_total = 0.0
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            xb, yb = x[idx], y[idx]
            if device is not None:
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            batch_loss = float(loss.detach()) * len(idx)
            total += batch_loss
            epoch_total += batch_loss
            seen += len(idx)
        last = epoch_total / n if n else float("nan")
    return EpochStats(total / max(seen, 1), last, seen)


def train_local(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float, momentum: float,
                weight_decay: float, batch_size: int, epochs: int, generator: torch.Generator,
                device: torch.device | None = None, grad_clip: float | None = None) -> tuple[float, int]:
    """SGD (lr, momentum, weight decay) on the cross-entropy; returns (mean loss, examples seen)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    stats = run_epochs(model, x, y, opt, nn.CrossEntropyLoss(), batch_size=batch_size, epochs=epochs,
                       generator=generator, device=device, grad_clip=grad_clip)
    return stats.mean_loss, stats.examples


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device | None = None,
             batch_size: int = 2048) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of a classifier on (x, y); batches moved to ``device`` if given."""
    model.eval()
    correct, loss = 0, 0.0
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    for s in range(0, len(x), batch_size):
        xb, yb = x[s : s + batch_size], y[s : s + batch_size]
        if device is not None:
            xb, yb = xb.to(device), yb.to(device)
        out = model(xb)
        loss += float(loss_fn(out, yb))
        correct += int((out.argmax(1) == yb).sum())
    return correct / max(len(x), 1), loss / max(len(x), 1)
