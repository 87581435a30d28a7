"""Gradient-matching objectives and image priors used by the inversion attacks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def dummy_gradient(model: nn.Module, params: Sequence[Tensor], x: Tensor, target: Tensor) -> tuple[Tensor, ...]:
    """Cross-entropy gradient of ``model`` at dummy input ``x``, differentiable w.r.t. ``x``.

    ``target`` is either class indices ``(1,)`` (hard label) or a probability
    vector ``(1, K)`` (DLG's soft label). ``create_graph=True`` keeps the graph
    for the second backward pass through the matching objective.
    """
    logits = model(x)
    if target.dtype == torch.long:
        loss = F.cross_entropy(logits, target)
    else:
        loss = torch.sum(-target * F.log_softmax(logits, dim=-1)) / logits.shape[0]
    return torch.autograd.grad(loss, params, create_graph=True)


def euclidean_distance(dummy: Sequence[Tensor], observed: Sequence[Tensor]) -> Tensor:
    """``sum_l ||g_l' - g_l||^2`` over parameters (DLG, Zhu et al. 2019, Eq. 4)."""
    return sum(((d - o) ** 2).sum() for d, o in zip(dummy, observed))  # type: ignore[return-value]


def cosine_distance(dummy: Sequence[Tensor], observed: Sequence[Tensor], observed_norm: Tensor) -> Tensor:
    """``1 - <g', g> / (||g'|| ||g||)`` with all parameters as one vector (Geiping et al. 2020, Eq. 4)."""
    dot = sum((d * o).sum() for d, o in zip(dummy, observed))
    dummy_norm = torch.sqrt(sum(d.pow(2).sum() for d in dummy))  # type: ignore[arg-type]
    return 1.0 - dot / (dummy_norm * observed_norm).clamp_min(1e-30)


def total_variation(x: Tensor) -> Tensor:
    """Anisotropic TV, ``mean |dx| + mean |dy|`` over the last two dims (Geiping et al.).

    ``x`` carries a batch dimension; inputs with fewer than two non-batch
    dimensions (tabular ``(1, d)``) have zero TV.
    """
    if x.ndim < 3:
        return x.new_zeros(())
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().mean()
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().mean()
    return dx + dy
