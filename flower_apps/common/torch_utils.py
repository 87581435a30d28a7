"""Torch glue: state dict <-> ArrayRecord, device choice."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from flwr.app import Array, ArrayRecord


def pick_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cpu'/'cuda'/'cuda:1' taken as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use 'auto' or 'cpu'")
    return torch.device(name)


def state_to_record(model: torch.nn.Module) -> ArrayRecord:
    """Model parameters and buffers as an ArrayRecord (numpy, CPU)."""
    return ArrayRecord(OrderedDict((k, Array(v.detach().cpu().numpy())) for k, v in model.state_dict().items()))


def record_to_state(record: ArrayRecord) -> OrderedDict[str, torch.Tensor]:
    """ArrayRecord -> state dict of CPU tensors."""
    return OrderedDict((k, torch.from_numpy(np.array(v.numpy(), copy=True))) for k, v in record.items())
