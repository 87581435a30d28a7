"""Models of the UnlinkableDFL study (registry) and the flat shareable state of a model.

* ``lenet5``: the classic LeNet-5 (LeCun et al. 1998) with ReLU and max pooling:
  conv 6@5x5 (padding 2 on 28x28 inputs, none on 32x32) - pool - conv 16@5x5 - pool -
  FC 400-120-84-classes. 61,706 parameters on MNIST (62,006 with 3 input channels).
  This is the variant that reproduces the paper's 26 (32-bit) and 7 (8-bit) fragments
  per update with 10,240-byte Sphinx bodies (see docs/unlinkable_dfl.md).
* ``squeezenet`` (torchvision SqueezeNet 1.0) and ``mobilenetv2`` (torchvision
  MobileNetV2), randomly initialised (no weights are downloaded); used for the payload
  tables and trainable on 3-channel 32x32 data (CIFAR-10).

The shareable state is every floating-point tensor of ``state_dict()`` (parameters and
BatchNorm running statistics), flattened in ``state_dict`` order; integer buffers
(``num_batches_tracked``) stay local.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from models.seeded_init import seeded_init
from registry import Registry


class LeNet5(nn.Module):
    """LeNet-5 with ReLU and max pooling; ``image_size`` 28 (padded conv1) or 32."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        if image_size not in (28, 32):
            raise ValueError(f"image_size must be 28 or 32 for LeNet-5, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=2 if image_size == 28 else 0), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _squeezenet(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    import torchvision

    if in_channels != 3:
        raise ValueError(f"squeezenet needs 3 input channels, got {in_channels}")
    return torchvision.models.squeezenet1_0(weights=None, num_classes=num_classes)


def _mobilenetv2(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    import torchvision

    if in_channels != 3:
        raise ValueError(f"mobilenetv2 needs 3 input channels, got {in_channels}")
    return torchvision.models.mobilenet_v2(weights=None, num_classes=num_classes)


ModelBuilder = Callable[[int, int, int], nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")
register_model = MODELS.register


register_model("lenet5", LeNet5)
register_model("squeezenet", _squeezenet)
register_model("mobilenetv2", _mobilenetv2)


def build_model(name: str, seed: int, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> nn.Module:
    """The common initial model w(0) of every node, reproducible per seed (global RNG untouched)."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    with seeded_init(seed):
        return MODELS[name](in_channels, num_classes, image_size)


def shareable_keys(model: nn.Module) -> list[str]:
    """``state_dict`` keys of floating-point tensors, in order (the flat vector's layout)."""
    return [k for k, v in model.state_dict().items() if v.is_floating_point()]


def state_vector(state: OrderedDict[str, torch.Tensor] | dict[str, torch.Tensor], keys: list[str]) -> np.ndarray:
    """Flatten the shareable tensors of ``state`` into one float32 vector."""
    return np.concatenate([state[k].detach().cpu().reshape(-1).numpy().astype(np.float32) for k in keys])


def load_vector(state: OrderedDict[str, torch.Tensor], keys: list[str], vector: np.ndarray) -> OrderedDict:
    """A copy of ``state`` whose shareable tensors are taken from ``vector``."""
    out = OrderedDict((k, v.clone()) for k, v in state.items())
    pos = 0
    for k in keys:
        n = out[k].numel()
        if pos + n > len(vector):
            raise ValueError(f"vector of length {len(vector)} is too short for the model")
        out[k] = torch.from_numpy(np.asarray(vector[pos : pos + n], dtype=np.float32).copy()).reshape(out[k].shape)
        pos += n
    if pos != len(vector):
        raise ValueError(f"vector has {len(vector)} values, the model's shareable state {pos}")
    return out
