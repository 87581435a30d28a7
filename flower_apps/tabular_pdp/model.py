"""The paper's regression MLP (in -> 64 -> 128 -> 64 -> 1, ReLU), its local training and its errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from flower_apps.common.local_training import run_epochs
from models.seeded_init import seeded_init
from registry import streams

if TYPE_CHECKING:
    from flwr.app import MetricRecordValues


class SeverityMLP(nn.Module):
    """MLP predicting Target_Severity_Score from the anonymized features."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        if in_features < 1:
            raise ValueError(f"in_features must be >= 1, got {in_features}")
        self.net = nn.Sequential(nn.Linear(in_features, 64), nn.ReLU(), nn.Linear(64, 128), nn.ReLU(),
                                 nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def build_model(seed: int, in_features: int) -> SeverityMLP:
    """The initial global model w(0), reproducible per seed (torch's global random state untouched)."""
    with seeded_init(seed):
        return SeverityMLP(in_features)


def client_generator(seed: int, server_round: int, cid: int) -> torch.Generator:
    """Batch-order generator of one client in one round (same in every DP setting: paired comparison).

    Client multiplier 1,000,003 and modulus 2**63, not the shared defaults: Table III was computed with them.
    """
    return streams.torch_generator("tabular-pdp.client", seed, server_round, cid)


def train_local(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float, batch_size: int, epochs: int,
                generator: torch.Generator, device: torch.device) -> float:
    """Adam (fresh state each round) on the MSE loss; returns the mean training loss of the last epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    return run_epochs(model, x.to(device), y.to(device), opt, nn.MSELoss(), batch_size=batch_size, epochs=epochs,
                      generator=generator).last_epoch_loss


@torch.no_grad()
def error_sums(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> dict[str, MetricRecordValues]:
    """Sums of absolute, relative (|e| / |y|) and squared errors, and the count."""
    model.eval()
    pred = model(x.to(device)).cpu().double()
    yd = y.double()
    err = (pred - yd).abs()
    if torch.any(yd == 0):
        raise ValueError("a target of 0 has no relative error")
    return {"abs-err-sum": float(err.sum()), "rel-err-sum": float((err / yd.abs()).sum()),
            "sq-err-sum": float((err**2).sum()), "num-examples": int(len(y))}
