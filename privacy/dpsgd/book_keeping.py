"""Book-keeping ghost clipping: the clipped gradient sum from the first backward pass, no second pass.

Ghost clipping needs every layer's output gradient g (per sample) and input a for the per-sample norms.
Opacus then backpropagates the clip-weighted loss sum_i c_i L_i a second time to get
sum_i c_i grad L_i. Bu et al. ("Differentially private optimization on large model at small cost",
ICML 2023, Alg. 1, "BK") keep a and g from the first pass instead: a layer's clipped sum is its ordinary
weight gradient with the output gradients scaled per sample, sum_i c_i a_i^T g_i = a^T (c * g), i.e. one
weight-gradient product per layer instead of a whole second backward (input gradients included).

A *book sampler* computes a layer's per-sample gradient norms (as a norm sampler does) and returns,
beside them, a function of the clipping coefficients c (shape (batch,)) that gives the layer's clipped
gradient sums. It keeps whichever is smaller: the layer's per-sample gradients when they were
materialized anyway (depthwise convs, norm layers: contracted with c), otherwise a and g (one weight-
gradient product). Checked against micro-batch gradients and the two-pass path
(tests/privacy/test_privacy_dpsgd_book_keeping.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, cast

import torch
from timm.layers import GroupNormAct
from torch import nn

from privacy.dpsgd.compat import PrefixTokenPosEmbed
from privacy.dpsgd.samplers import (
    Sampler,
    conv2d_grad_sample,
    conv2d_norm_sample,
    group_norm_act_grad_sample,
    token_embed_grad_sample,
)

ClippedSum = Callable[[torch.Tensor], dict[nn.Parameter, torch.Tensor]]
BookSampler = Callable[[Any, list[torch.Tensor], torch.Tensor],  # layer: Any, as for samplers.Sampler
                       tuple[dict[nn.Parameter, torch.Tensor], ClippedSum]]


def contract_grad_samples(grad_samples: dict[nn.Parameter, torch.Tensor]) -> ClippedSum:
    """Clipped sums sum_i c_i G_i of materialized per-sample gradients G (shape (batch, *param.shape))."""
    def clipped_sum(coef: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        return {p: (coef.to(gs.dtype) @ gs.reshape(gs.shape[0], -1)).view(p.shape) for p, gs in grad_samples.items()}
    return clipped_sum


def _scaled(backprops: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    return backprops * coef.to(backprops.dtype).view(-1, *([1] * (backprops.dim() - 1)))


def from_grad_sampler(grad_sampler: Sampler) -> BookSampler:
    """A book sampler for a layer whose per-sample gradients are small (norm layers, the ViT token leaf)."""
    def book_sampler(layer: nn.Module, activations: list[torch.Tensor], backprops: torch.Tensor):
        gs = grad_sampler(layer, activations, backprops)
        n = backprops.shape[0]
        return {p: g.reshape(n, -1).norm(2, dim=1) for p, g in gs.items()}, contract_grad_samples(gs)
    return book_sampler


def linear_norm_sample(layer: nn.Linear, activations: list[torch.Tensor],
                       backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-sample gradient norms of a linear layer on (batch, ..., features) inputs.

    With T positions per sample, ||G_i||_F^2 = ||a_i^T g_i||_F^2 is computed in Gram form
    sum_{t,s} (a_t . a_s)(g_t . g_s) (cost T^2 (d_in + d_out)) when that is cheaper than forming
    G_i (cost T d_in d_out), directly otherwise; the bias norm is ||sum_t g_t||.
    """
    n, d_out, d_in = backprops.shape[0], layer.out_features, layer.in_features
    g = backprops.reshape(n, -1, d_out)
    a = activations[0].to(backprops.dtype).reshape(n, -1, d_in)
    t = g.shape[1]
    ret: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight.requires_grad:
        if t == 1:
            sq = g.squeeze(1).square().sum(1) * a.squeeze(1).square().sum(1)
        elif t * (d_in + d_out) < d_in * d_out:
            sq = (torch.bmm(g, g.transpose(1, 2)) * torch.bmm(a, a.transpose(1, 2))).flatten(1).sum(1)
        else:
            sq = torch.bmm(g.transpose(1, 2), a).flatten(1).square().sum(1)
        ret[cast(nn.Parameter, layer.weight)] = sq.clamp(min=0).sqrt()
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = g.sum(1).norm(2, dim=1)
    return ret


def linear_book_sample(layer: nn.Linear, activations: list[torch.Tensor], backprops: torch.Tensor):
    """Linear layer: norms by :func:`linear_norm_sample`; clipped sums (c * g)^T a over batch and positions."""
    norms = linear_norm_sample(layer, activations, backprops)
    a = activations[0].to(backprops.dtype)

    def clipped_sum(coef: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        gc = _scaled(backprops, coef).reshape(-1, layer.out_features)
        ret: dict[nn.Parameter, torch.Tensor] = {}
        if layer.weight.requires_grad:
            ret[cast(nn.Parameter, layer.weight)] = gc.t() @ a.reshape(-1, layer.in_features)
        if layer.bias is not None and layer.bias.requires_grad:
            ret[layer.bias] = gc.sum(0)
        return ret
    return norms, clipped_sum


def conv2d_book_sample(layer: nn.Conv2d, activations: list[torch.Tensor], backprops: torch.Tensor):
    """Conv2d: norms by :func:`~privacy.dpsgd.samplers.conv2d_norm_sample` (Gram form where cheaper); clipped
    sums by contracting the per-sample gradients when they were formed and are no larger than the layer's
    input and output gradient together, else by the weight-gradient convolution on c-scaled output gradients."""
    x = activations[0].to(backprops.dtype)
    n = x.shape[0]
    zero_padded = layer.padding_mode == "zeros" and not isinstance(layer.padding, str)
    o, p = layer.out_channels, layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
    gram = layer.groups == 1 and backprops[0, 0].numel() * (o + p) < o * p
    if not zero_padded or n == 0 or not gram:
        gs = conv2d_grad_sample(layer, activations, backprops)
        norms = {q: g.reshape(n, -1).norm(2, dim=1) for q, g in gs.items()}
        if not zero_padded or n == 0 or sum(g.numel() for g in gs.values()) <= x.numel() + backprops.numel():
            return norms, contract_grad_samples(gs)
        del gs
    else:
        norms = conv2d_norm_sample(layer, activations, backprops)
    has_bias = layer.bias is not None and layer.bias.requires_grad

    def clipped_sum(coef: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        # the weight half of autograd's own convolution backward (aten::convolution_backward)
        _, gw, gb = torch.ops.aten.convolution_backward(
            _scaled(backprops, coef), x, layer.weight.detach(), [o] if has_bias else None, list(layer.stride),
            list(layer.padding), list(layer.dilation), False, [0, 0], layer.groups,
            [False, layer.weight.requires_grad, has_bias])
        ret: dict[nn.Parameter, torch.Tensor] = {}
        if layer.weight.requires_grad:
            ret[cast(nn.Parameter, layer.weight)] = gw
        if has_bias:
            ret[cast(nn.Parameter, layer.bias)] = gb
        return ret
    return norms, clipped_sum


# Read-only, read by privacy.dpsgd.grad_sample.FastGhostClippingModule only. Layers without an entry
# whose per-sample gradients are materialized (Opacus' GroupNorm / LayerNorm samplers, functorch) are
# contracted with contract_grad_samples; a layer with only a norm sampler makes the step take two passes.
BOOK_SAMPLERS: Mapping[type[nn.Module], BookSampler] = MappingProxyType({
    nn.Linear: linear_book_sample,
    nn.Conv2d: conv2d_book_sample,
    GroupNormAct: from_grad_sampler(group_norm_act_grad_sample),
    PrefixTokenPosEmbed: from_grad_sampler(token_embed_grad_sample),
})
