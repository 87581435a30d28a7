"""The seed paper's MNIST CNN (Sec. 3.2)."""

from __future__ import annotations

import torch
from torch import nn


class MnistCNN(nn.Module):
    """conv 1->16 (3x3, pad 1), ReLU, maxpool 2; conv 16->32, ReLU, maxpool 2; FC 1568->128, ReLU,
    dropout 0.2; FC 128->10."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = 32 * (image_size // 4) ** 2  # 1568 for 28x28
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model(seed: int, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> MnistCNN:
    """The initial global model w(0), reproducible per seed."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return MnistCNN(in_channels, num_classes, image_size)
    finally:
        torch.random.set_rng_state(gen_state)
