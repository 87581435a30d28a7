"""The seed paper's small image CNN (Sec. 3.2): two conv blocks and two fully connected layers.

Built for MNIST (1 x 28 x 28, 10 classes), it takes any number of channels and classes and any
square image of side >= 4 (the two 2x2 max-pools floor it to side // 4).
"""

from __future__ import annotations

import torch
from torch import nn

from models.seeded_init import seeded_init


class SmallCNN(nn.Module):
    """conv 1->16 (3x3, pad 1), ReLU, maxpool 2; conv 16->32, ReLU, maxpool 2; FC 1568->128, ReLU,
    dropout 0.2; FC 128->10 (sizes for 1 x 28 x 28 inputs and 10 classes)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        if in_channels < 1 or num_classes < 1:
            raise ValueError(f"in_channels and num_classes must be >= 1, got {in_channels} and {num_classes}")
        if image_size < 4:
            raise ValueError(f"image_size must be >= 4 (two 2x2 max-pools), got {image_size}")
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


def build_small_cnn(seed: int | torch.Generator, in_channels: int = 1, num_classes: int = 10,
                    image_size: int = 28) -> SmallCNN:
    """The initial model w(0), reproducible per seed; torch's global random state is left unchanged.

    Parameters
    ----------
    seed : int or torch.Generator
        The initial weights are those ``torch.manual_seed(seed)`` followed by ``SmallCNN(...)``
        gives (see :func:`models.seeded_init.seeded_init`).
    in_channels, num_classes, image_size : int
        The input images' channels and side, and the number of classes.
    """
    with seeded_init(seed):
        return SmallCNN(in_channels, num_classes, image_size)
