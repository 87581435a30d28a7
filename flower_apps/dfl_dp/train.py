"""Local training and evaluation (seed paper, Sec. 3.2)."""

from __future__ import annotations

import torch
from torch import nn


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    batch_size: int,
    epochs: int,
    grad_clip: float,
    generator: torch.Generator,
    device: torch.device,
) -> tuple[float, int]:
    """SGD (lr, momentum, weight decay), shuffled mini-batches, optimizer-level gradient-norm
    clipping at ``grad_clip`` (in every condition). Returns (mean loss, examples seen)."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    total, seen = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
    return total / max(seen, 1), seen


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
             batch_size: int = 2048) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on (x, y)."""
    model.eval()
    correct, loss, loss_fn = 0, 0.0, nn.CrossEntropyLoss(reduction="sum")
    for s in range(0, len(x), batch_size):
        xb, yb = x[s : s + batch_size].to(device), y[s : s + batch_size].to(device)
        out = model(xb)
        loss += float(loss_fn(out, yb))
        correct += int((out.argmax(1) == yb).sum())
    return correct / len(x), loss / len(x)


def client_generator(seed: int, server_round: int, client_id: int) -> torch.Generator:
    """The shuffling generator of (seed, round, client): same seed, same batches."""
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + server_round) * 10_007 + client_id)
    return g
