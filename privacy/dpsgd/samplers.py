"""Fast per-sample gradient and gradient-norm samplers for the layers of the ultrasound backbones.

Opacus' conv sampler forms the full (C_out x C_in k^2) product per sample and keeps its block
diagonal, which for a depthwise conv (groups = C) is C times the work; :func:`conv2d_grad_sample`
contracts per group (depthwise: one grouped convolution of the inputs with the output gradients as
kernels; 1x1: a batched matmul). timm's ``GroupNormAct`` and ``LayerNorm`` are not in Opacus' registry
(it looks up exact types), so Opacus falls back to functorch for each of them; :func:`layer_norm_grad_sample`
applies the LayerNorm formula; :func:`group_norm_act_grad_sample` recomputes the normalization,
maps the output gradient through the activation (vjp) and applies Opacus' GroupNorm formula. Ghost
clipping gets per-sample *norm* samplers for both (convs in Gram form where that is cheaper).

Nothing here is registered with Opacus: :data:`FAST_GRAD_SAMPLERS` / :data:`FAST_NORM_SAMPLERS` are
read only by the GradSampleModule subclasses of :mod:`privacy.dpsgd.grad_sample`, i.e. by the models
made private with them. All samplers are checked against per-sample micro-batch gradients
(tests/ultrasound/test_ultrasound_dpsgd.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, cast

import torch
import torch.nn.functional as F
from timm.layers import GroupNormAct
from timm.layers import LayerNorm as TimmLayerNorm
from torch import nn

from privacy.dpsgd.compat import PrefixTokenPosEmbed

# the layer is Any: each sampler takes its own nn.Module subclass (a Callable is contravariant in its arguments)
Sampler = Callable[[Any, list[torch.Tensor], torch.Tensor], dict[nn.Parameter, torch.Tensor]]


def conv2d_grad_sample(layer: nn.Conv2d, activations: list[torch.Tensor],
                       backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-sample conv gradients contracted per group (grouped / depthwise convs, and 1x1 convs without
    an unfold copy); functorch for non-zero padding modes (Opacus' sampler pads with zeros); Opacus' own
    sampler for anything else."""
    from opacus.grad_sample.conv import compute_conv_grad_sample
    from opacus.utils.tensor_utils import unfold2d

    if layer.padding_mode != "zeros":  # Opacus' sampler would unfold with zero padding: per-sample vjp instead
        from opacus.grad_sample.functorch import ft_compute_per_sample_gradient

        return ft_compute_per_sample_gradient(layer, activations, backprops)
    x = activations[0]
    n, g = x.shape[0], layer.groups
    pointwise = (layer.kernel_size == (1, 1) and layer.stride == (1, 1) and layer.padding in ((0, 0), "valid")
                 and g == 1)
    if n == 0 or not (pointwise or (g > 1 and not isinstance(layer.padding, str))):
        return compute_conv_grad_sample(layer, activations, backprops)
    x = x.to(backprops.dtype)
    ret: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight.requires_grad:
        if g == layer.in_channels and not pointwise and backprops[0, 0].numel() >= 16:
            # (tiny feature maps: oneDNN's grouped conv with n * C groups of 1x1 kernels is slow; matmul below)
            ret[cast(nn.Parameter, layer.weight)] = _depthwise_grad_sample(layer, x, backprops)
        else:
            if pointwise:
                cols = x.reshape(n, 1, layer.in_channels, -1)  # a 1x1 conv's unfold is the input itself
            else:
                cols = unfold2d(x, kernel_size=layer.kernel_size, padding=layer.padding, stride=layer.stride,
                                dilation=layer.dilation)  # (n, C_in k^2, L)
                cols = cols.view(n, g, -1, cols.shape[-1])
            grad_out = backprops.reshape(n, g, -1, cols.shape[-1])
            ret[cast(nn.Parameter, layer.weight)] = torch.matmul(grad_out, cols.transpose(-1, -2)).reshape(
                n, *layer.weight.shape)
    if layer.bias is not None and layer.bias.requires_grad:
        ret[cast(nn.Parameter, layer.bias)] = backprops.reshape(n, layer.out_channels, -1).sum(2)
    return ret


def _depthwise_grad_sample(layer: nn.Conv2d, x: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """Depthwise conv: dW[b, o, 0, i, j] = sum_hw dY[b, o, h, w] X_pad[b, o // m, h s + i d, w s + j d], computed as
    one grouped convolution of the padded inputs with the output gradients as kernels (dilation s, stride d)."""
    n, c, h, w = x.shape
    ph, pw = cast(tuple[int, int], layer.padding)  # the caller excluded string paddings
    kh, kw = layer.kernel_size
    x_pad = F.pad(x, (pw, pw, ph, ph)).reshape(1, n * c, h + 2 * ph, w + 2 * pw)
    kernels = grad_out.reshape(n * layer.out_channels, 1, *grad_out.shape[2:])
    out = F.conv2d(x_pad, kernels, groups=n * c, stride=layer.dilation, dilation=layer.stride)
    return out[:, :, :kh, :kw].reshape(n, layer.out_channels, 1, kh, kw)


def _act_grad(act: nn.Module, z: torch.Tensor, grad_y: torch.Tensor) -> torch.Tensor:
    """dL/dz from dL/dy for y = act(z): closed forms for the common activations, vjp otherwise."""
    if isinstance(act, nn.Identity):
        return grad_y
    if type(act) is nn.ReLU:  # one fused kernel each: grad_y where z > 0 (0 < z < 6), else 0
        return torch.ops.aten.threshold_backward(grad_y, z, 0)
    if type(act) is nn.ReLU6:
        return torch.ops.aten.hardtanh_backward(grad_y, z, 0.0, 6.0)
    with torch.enable_grad():
        _, vjp = cast(tuple[torch.Tensor, Callable[..., tuple[torch.Tensor, ...]]], torch.func.vjp(act, z.detach()))
        return vjp(grad_y)[0]


def group_norm_act_grad_sample(layer: GroupNormAct, activations: list[torch.Tensor],
                               backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """timm GroupNormAct: y = act(GN(x)); dL/dGN through the activation, then Opacus' GroupNorm formula."""
    if not isinstance(layer.drop, nn.Identity):
        raise NotImplementedError(f"GroupNormAct with drop layer {type(layer.drop).__name__} has no fast sampler")
    x = activations[0].to(backprops.dtype)
    n, c = x.shape[:2]
    x_hat = F.group_norm(x, layer.num_groups, None, None, layer.eps).reshape(n, c, -1)
    grad_y = backprops.reshape(n, c, -1)
    if isinstance(layer.act, nn.Identity):
        grad_z = grad_y
    else:
        ones = torch.ones(1, c, 1, dtype=x.dtype, device=x.device)
        w = layer.weight.detach().view(1, c, 1) if layer.weight is not None else ones
        b = layer.bias.detach().view(1, c, 1) if layer.bias is not None else ones * 0
        grad_z = _act_grad(layer.act, torch.addcmul(b, x_hat, w), grad_y)
    ret: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight is not None and layer.weight.requires_grad:
        ret[layer.weight] = torch.einsum("ncl,ncl->nc", x_hat, grad_z)
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = grad_z.sum(2)
    return ret


def layer_norm_grad_sample(layer: nn.LayerNorm, activations: list[torch.Tensor],
                           backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """timm's ``LayerNorm`` (an ``nn.LayerNorm`` subclass computing the same ``F.layer_norm``; Opacus looks
    samplers up by exact type and fell back to functorch for it): per sample, sum over positions of
    x_hat * g (weight) and g (bias)."""
    x = activations[0].to(backprops.dtype)
    n, shape = x.shape[0], tuple(layer.normalized_shape)
    ret: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight is not None and layer.weight.requires_grad:
        x_hat = F.layer_norm(x, shape, eps=layer.eps)
        ret[layer.weight] = (x_hat * backprops).reshape(n, -1, *shape).sum(1)
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = backprops.reshape(n, -1, *shape).sum(1)
    return ret


def token_embed_grad_sample(layer: PrefixTokenPosEmbed, activations: list[torch.Tensor],
                            backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """y = cat([cls, x]) + pos: dL/dpos per sample is the output gradient, dL/dcls its first token."""
    ret: dict[nn.Parameter, torch.Tensor] = {}
    if layer.pos_embed.requires_grad:
        ret[layer.pos_embed] = backprops.unsqueeze(1)
    if layer.cls_token.requires_grad:
        ret[layer.cls_token] = backprops[:, None, :1, :]
    return ret


def conv2d_norm_sample(layer: nn.Conv2d, activations: list[torch.Tensor],
                       backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Ghost clipping for convs: per-sample gradient norms without materializing the gradients where that is
    cheaper (Gram form ||sum_l g_l a_l^T||^2 = sum_{l,m} (g_l . g_m)(a_l . a_m), cost L^2 (o + p) instead of
    L o p -- the late, small-feature-map layers that hold most parameters); per-sample gradients otherwise."""
    x = activations[0]
    n = x.shape[0]
    length = backprops[0, 0].numel()
    o, p = layer.out_channels, layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
    if (layer.groups != 1 or n == 0 or isinstance(layer.padding, str) or layer.padding_mode != "zeros"
            or length * (o + p) >= o * p):
        return _norms(conv2d_grad_sample(layer, activations, backprops), n)
    from opacus.utils.tensor_utils import unfold2d

    x = x.to(backprops.dtype)
    if layer.kernel_size == (1, 1) and layer.stride == (1, 1) and layer.padding in ((0, 0), "valid"):
        cols = x.reshape(n, layer.in_channels, -1)
    else:
        cols = unfold2d(x, kernel_size=layer.kernel_size, padding=layer.padding, stride=layer.stride,
                        dilation=layer.dilation)
    grad_out = backprops.reshape(n, o, -1)
    ret: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight.requires_grad:
        ggt = torch.bmm(grad_out.transpose(1, 2), grad_out)  # (n, L, L)
        aat = torch.bmm(cols.transpose(1, 2), cols)
        ret[cast(nn.Parameter, layer.weight)] = (ggt * aat).flatten(1).sum(1).clamp(min=0).sqrt()
    if layer.bias is not None and layer.bias.requires_grad:
        ret[cast(nn.Parameter, layer.bias)] = grad_out.sum(2).norm(2, dim=1)
    return ret


def _norms(grad_samples: dict[nn.Parameter, torch.Tensor], n: int) -> dict[nn.Parameter, torch.Tensor]:
    return {q: g.reshape(n, -1).norm(2, dim=1) for q, g in grad_samples.items()}


def group_norm_act_norm_sample(layer: GroupNormAct, activations: list[torch.Tensor],
                               backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Ghost clipping for GroupNormAct: its per-sample gradients are small (2 C per sample); their norms."""
    return _norms(group_norm_act_grad_sample(layer, activations, backprops), activations[0].shape[0])


def token_embed_norm_sample(layer: PrefixTokenPosEmbed, activations: list[torch.Tensor],
                            backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Ghost clipping for the ViT token leaf: norms of its (sliced) per-sample gradients."""
    return _norms(token_embed_grad_sample(layer, activations, backprops), backprops.shape[0])


# Read-only: the scope of these samplers is the models wrapped by privacy.dpsgd.grad_sample, nothing else.
FAST_GRAD_SAMPLERS: Mapping[type[nn.Module], Sampler] = MappingProxyType({
    nn.Conv2d: conv2d_grad_sample,
    GroupNormAct: group_norm_act_grad_sample,
    TimmLayerNorm: layer_norm_grad_sample,
    PrefixTokenPosEmbed: token_embed_grad_sample,
})
FAST_NORM_SAMPLERS: Mapping[type[nn.Module], Sampler] = MappingProxyType({
    nn.Conv2d: conv2d_norm_sample,
    GroupNormAct: group_norm_act_norm_sample,
    PrefixTokenPosEmbed: token_embed_norm_sample,
})
