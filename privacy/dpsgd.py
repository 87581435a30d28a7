"""Client-side DP-SGD with Opacus: making timm models Opacus-compatible, wiring, accounting.

Model fixing (:func:`make_opacus_compatible`) -- every change is returned as a
:class:`ModelChange` so runs can report it:

* timm's fused ``BatchNormAct2d`` (MobileNetV2, DenseNet-121, ...) subclasses
  ``nn.BatchNorm2d`` but is *not* converted by ``ModuleValidator.fix``; ``make_private``
  then raises ``NotImplementedError``. It is replaced deliberately by timm's
  ``GroupNormAct`` carrying over the activation and drop layer (and the affine
  weights), so the block computes norm -> drop -> act as before.
* Remaining BatchNorm layers: ``ModuleValidator.fix`` (GroupNorm), diffed and reported.
* timm ResNet blocks add the shortcut in place onto the last norm's output (``x += shortcut``),
  which Opacus' backward hooks refuse ("a view ... is being modified inplace"); the
  block's unused ``drop_path`` slot gets a clone so the add happens on a copy.
* In-place activations are switched off (same reason).
* timm's ViT keeps ``cls_token`` / ``pos_embed`` on the model itself, so Opacus re-runs the whole
  network per sample (functorch) for them; they move into a leaf module (values kept) with a sampler.
* timm's ``RelPosBias`` (CoAtNet) has trainable tables next to buffers, which Opacus
  cannot compute per-sample gradients for: its tables are frozen (kept at their
  initial / pretrained values) and reported.

Fast per-sample gradients (:func:`register_fast_grad_samplers`, done at import): Opacus' conv
sampler forms the full (C_out x C_in k^2) product per sample and keeps its block diagonal, which
for a depthwise conv (groups = C) is C times the work; ours contracts per group (depthwise: one
grouped convolution of the inputs with the output gradients as kernels; 1x1: a batched matmul). timm's
``GroupNormAct`` is not in Opacus' registry, so Opacus fell back to functorch for each of them;
ours recomputes the normalization, maps the output gradient through the activation (vjp) and
applies Opacus' GroupNorm formula. Ghost clipping gets per-sample *norm* samplers for both (convs in
Gram form where that is cheaper), and :func:`ghost_clipping_backward` skips the parameter gradients
of the first pass. Opacus' zero-filled copy of every per-sample gradient is skipped for full batches.
All are checked against per-sample micro-batch gradients (tests/ultrasound/test_ultrasound_dpsgd.py).

Accounting: an accountant only *records* (sigma, q, steps) events; epsilon comes from
Google dp-accounting's RDP accountant on ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``
compositions. :func:`paper_sqrt_t_bound` reproduces the paper's basic-composition
estimate for comparison only (it is not a valid DP-SGD bound under subsampling).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import dp_accounting
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from privacy.randomness import STREAM_DPSGD, NoiseSource

GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew", "ghost")


@dataclass(frozen=True)
class ModelChange:
    """One change made to a model for DP-SGD."""

    module: str
    old: str
    new: str
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


class _CloneOutput(nn.Module):
    """Returns a copy of its input (so a following in-place add does not touch a hooked output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


def _group_count(channels: int, max_groups: int = 32) -> int:
    return math.gcd(max_groups, channels)


def replace_batchnorm_act(model: nn.Module, prefix: str = "") -> list[ModelChange]:
    """Replace every timm ``BatchNormAct2d`` by ``GroupNormAct`` (same act/drop, affine weights copied)."""
    from timm.layers import BatchNormAct2d, GroupNormAct

    changes: list[ModelChange] = []
    for name, child in list(model.named_children()):
        path = f"{prefix}{name}"
        if isinstance(child, BatchNormAct2d):
            groups = _group_count(child.num_features)
            new = GroupNormAct(child.num_features, num_groups=groups, eps=child.eps, affine=child.affine)
            new.act, new.drop = child.act, child.drop
            if child.affine:
                with torch.no_grad():
                    new.weight.copy_(child.weight)
                    new.bias.copy_(child.bias)
            setattr(model, name, new)
            changes.append(ModelChange(path, "timm BatchNormAct2d", f"timm GroupNormAct({groups} groups, "
                                       f"act {type(child.act).__name__})", "fused BN+act is not fixed by "
                                       "ModuleValidator.fix; BatchNorm mixes samples"))
        else:
            changes += replace_batchnorm_act(child, f"{path}.")
    return changes


class PrefixTokenPosEmbed(nn.Module):
    """A ViT's class token and learned position embedding as a leaf module.

    timm keeps them as parameters of the model itself; Opacus then falls back to functorch for the
    *root* module, i.e. re-runs the whole network per sample (8x the step time at 32 px). As a leaf,
    their per-sample gradients are slices of the output gradient (:func:`_token_embed_grad_sample`).
    Computes cat([cls, x], 1) + pos_embed, timm's default (class token inside the position table).
    """

    def __init__(self, cls_token: nn.Parameter, pos_embed: nn.Parameter) -> None:
        super().__init__()
        self.cls_token = cls_token
        self.pos_embed = pos_embed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed


class DpVisionTransformer(VisionTransformer):
    """timm's VisionTransformer whose class token and position embedding live in ``token_embed``."""

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.pos_drop(self.token_embed(x.view(x.shape[0], -1, x.shape[-1])))


def _move_vit_tokens(model: nn.Module) -> list[ModelChange]:
    """Move a timm ViT's cls_token / pos_embed into a :class:`PrefixTokenPosEmbed` child (values kept)."""
    if type(model) is not VisionTransformer or model.cls_token is None or model.pos_embed is None:
        return []
    if model.reg_token is not None or model.no_embed_class or model.dynamic_img_size:
        return []  # other token layouts: left to Opacus' functorch fallback
    cls_token, pos_embed = model.cls_token, model.pos_embed
    del model.cls_token, model.pos_embed
    model.cls_token = model.pos_embed = None
    model.token_embed = PrefixTokenPosEmbed(cls_token, pos_embed)
    model.__class__ = DpVisionTransformer  # same module, its _pos_embed reads token_embed
    return [ModelChange("cls_token, pos_embed", "parameters of the ViT itself", "token_embed (PrefixTokenPosEmbed)",
                        "Opacus would recompute the whole network per sample for parameters of the root module")]


def make_opacus_compatible(model: nn.Module) -> tuple[nn.Module, list[ModelChange]]:
    """Return (fixed model, changes); raises ValueError if Opacus still refuses the model."""
    from opacus.validators import ModuleValidator

    changes = replace_batchnorm_act(model) + _move_vit_tokens(model)
    before = {n: type(m).__name__ for n, m in model.named_modules()}
    model = ModuleValidator.fix(model)
    for n, m in model.named_modules():
        if n in before and before[n] != type(m).__name__ and before[n].startswith(("BatchNorm", "SyncBatchNorm")):
            changes.append(ModelChange(n, before[n], type(m).__name__, "ModuleValidator.fix: BatchNorm mixes samples"))
    for n, m in model.named_modules():
        kind = type(m).__name__
        if kind in ("Bottleneck", "BasicBlock") and hasattr(m, "drop_path") and m.drop_path is None:
            m.drop_path = _CloneOutput()
            changes.append(ModelChange(n, f"{kind} (in-place residual add)", f"{kind} (add on a copy)",
                                       "Opacus' backward hooks refuse in-place ops on hooked outputs"))
        if kind == "RelPosBias":
            frozen = [p for p in m.parameters() if p.requires_grad]
            if frozen:
                for p in frozen:
                    p.requires_grad_(False)
                changes.append(ModelChange(n, "RelPosBias (trainable)", "RelPosBias (frozen)",
                                           "Opacus has no per-sample gradients for modules mixing "
                                           "trainable tables and buffers"))
    n_inplace = 0
    for m in model.modules():
        if getattr(m, "inplace", False) is True:
            m.inplace = False
            n_inplace += 1
    if n_inplace:
        changes.append(ModelChange("*", f"{n_inplace} in-place activations", "out-of-place",
                                   "Opacus' backward hooks refuse in-place ops on hooked outputs"))
    errors = ModuleValidator.validate(model.train(), strict=False)  # Opacus validates in training mode
    if errors:
        raise ValueError(f"model is still not Opacus-compatible after fixing: {errors[:3]}")
    return model, changes


def _conv2d_grad_sample(layer: nn.Conv2d, activations: list[torch.Tensor],
                        backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-sample conv gradients contracted per group (grouped / depthwise convs, and 1x1 convs without
    an unfold copy); Opacus' own sampler for anything else."""
    from opacus.grad_sample.conv import compute_conv_grad_sample
    from opacus.utils.tensor_utils import unfold2d

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
            ret[layer.weight] = _depthwise_grad_sample(layer, x, backprops)
        else:
            if pointwise:
                cols = x.reshape(n, 1, layer.in_channels, -1)  # a 1x1 conv's unfold is the input itself
            else:
                cols = unfold2d(x, kernel_size=layer.kernel_size, padding=layer.padding, stride=layer.stride,
                                dilation=layer.dilation)  # (n, C_in k^2, L)
                cols = cols.view(n, g, -1, cols.shape[-1])
            grad_out = backprops.reshape(n, g, -1, cols.shape[-1])
            ret[layer.weight] = torch.matmul(grad_out, cols.transpose(-1, -2)).reshape(n, *layer.weight.shape)
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = backprops.reshape(n, layer.out_channels, -1).sum(2)
    return ret


def _depthwise_grad_sample(layer: nn.Conv2d, x: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """Depthwise conv: dW[b, o, 0, i, j] = sum_hw dY[b, o, h, w] X_pad[b, o // m, h s + i d, w s + j d], computed as
    one grouped convolution of the padded inputs with the output gradients as kernels (dilation s, stride d)."""
    n, c, h, w = x.shape
    ph, pw = layer.padding
    kh, kw = layer.kernel_size
    x_pad = F.pad(x, (pw, pw, ph, ph)).reshape(1, n * c, h + 2 * ph, w + 2 * pw)
    kernels = grad_out.reshape(n * layer.out_channels, 1, *grad_out.shape[2:])
    out = F.conv2d(x_pad, kernels, groups=n * c, stride=layer.dilation, dilation=layer.stride)
    return out[:, :, :kh, :kw].reshape(n, layer.out_channels, 1, kh, kw)


def _act_grad(act: nn.Module, z: torch.Tensor, grad_y: torch.Tensor) -> torch.Tensor:
    """dL/dz from dL/dy for y = act(z): closed forms for the common activations, vjp otherwise."""
    if isinstance(act, nn.Identity):
        return grad_y
    if type(act) is nn.ReLU:
        return grad_y * (z > 0)
    if type(act) is nn.ReLU6:
        return grad_y * ((z > 0) & (z < 6))
    with torch.enable_grad():
        _, vjp = torch.func.vjp(act, z.detach())
        return vjp(grad_y)[0]


def _group_norm_act_grad_sample(layer: nn.Module, activations: list[torch.Tensor],
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


def _store_grad_sample(*, param: torch.Tensor, grad_sample: torch.Tensor, max_batch_len: int) -> None:
    """Opacus' ``create_or_accumulate_grad_sample`` without its zero-filled copy for a full batch.

    Opacus allocates a zeroed (max_batch_len, *shape) buffer per parameter and copies the
    per-sample gradients into it on every step; when the batch is full the gradients can be
    kept as they are (a parameter used twice in one forward accumulates out of place).
    """
    if not param.requires_grad:
        return
    if hasattr(param, "_current_grad_sample"):
        cur = param._current_grad_sample
        n = grad_sample.shape[0]
        param._current_grad_sample = torch.cat([cur[:n] + grad_sample, cur[n:]]) if n < len(cur) else cur + grad_sample
    elif grad_sample.shape[0] == max_batch_len:
        param._current_grad_sample = grad_sample
    else:
        buf = grad_sample.new_zeros(torch.Size([max_batch_len]) + grad_sample.shape[1:])
        buf[: grad_sample.shape[0]] = grad_sample
        param._current_grad_sample = buf


def _conv2d_norm_sample(layer: nn.Conv2d, activations: list[torch.Tensor],
                        backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Ghost clipping for convs: per-sample gradient norms without materializing the gradients where that is
    cheaper (Gram form ||sum_l g_l a_l^T||^2 = sum_{l,m} (g_l . g_m)(a_l . a_m), cost L^2 (o + p) instead of
    L o p -- the late, small-feature-map layers that hold most parameters); per-sample gradients otherwise."""
    x = activations[0]
    n = x.shape[0]
    length = backprops[0, 0].numel()
    o, p = layer.out_channels, layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
    if layer.groups != 1 or n == 0 or isinstance(layer.padding, str) or length * (o + p) >= o * p:
        return {q: g.reshape(n, -1).norm(2, dim=1) for q, g in _conv2d_grad_sample(layer, activations,
                                                                                    backprops).items()}
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
        ret[layer.weight] = (ggt * aat).flatten(1).sum(1).clamp(min=0).sqrt()
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = grad_out.sum(2).norm(2, dim=1)
    return ret


def _token_embed_grad_sample(layer: PrefixTokenPosEmbed, activations: list[torch.Tensor],
                             backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """y = cat([cls, x]) + pos: dL/dpos per sample is the output gradient, dL/dcls its first token."""
    ret: dict[nn.Parameter, torch.Tensor] = {}
    if layer.pos_embed.requires_grad:
        ret[layer.pos_embed] = backprops.unsqueeze(1)
    if layer.cls_token.requires_grad:
        ret[layer.cls_token] = backprops[:, None, :1, :]
    return ret


def _token_embed_norm_sample(layer: PrefixTokenPosEmbed, activations: list[torch.Tensor],
                             backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    n = backprops.shape[0]
    return {q: g.reshape(n, -1).norm(2, dim=1)
            for q, g in _token_embed_grad_sample(layer, activations, backprops).items()}


def _group_norm_act_norm_sample(layer: nn.Module, activations: list[torch.Tensor],
                                backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Ghost clipping for GroupNormAct: its per-sample gradients are small (2 C per sample); their norms."""
    n = activations[0].shape[0]
    return {q: g.reshape(n, -1).norm(2, dim=1)
            for q, g in _group_norm_act_grad_sample(layer, activations, backprops).items()}


_OPACUS_DEFAULTS: dict = {}


def _opacus_slots() -> list[tuple[object, object]]:
    import opacus.grad_sample.grad_sample_module as gsm
    import opacus.grad_sample.grad_sample_module_fast_gradient_clipping as gsm_fast
    from opacus.grad_sample import GradSampleModule
    from timm.layers import GroupNormAct

    fast = gsm_fast.GradSampleModuleFastGradientClipping
    return [(GradSampleModule.GRAD_SAMPLERS, nn.Conv2d), (GradSampleModule.GRAD_SAMPLERS, GroupNormAct),
            (GradSampleModule.GRAD_SAMPLERS, PrefixTokenPosEmbed),
            (fast.NORM_SAMPLERS, nn.Conv2d), (fast.NORM_SAMPLERS, GroupNormAct), (fast.NORM_SAMPLERS, PrefixTokenPosEmbed),
            (gsm.__dict__, "create_or_accumulate_grad_sample"), (gsm_fast.__dict__, "create_or_accumulate_grad_sample")]


def unregister_fast_grad_samplers() -> None:
    """Restore Opacus' own samplers (benchmarks compare against them)."""
    for (table, key), old in zip(_opacus_slots(), _OPACUS_DEFAULTS.get("slots", [])):
        if old is None:
            table.pop(key, None)
        else:
            table[key] = old


def register_fast_grad_samplers() -> None:
    """Put the samplers above into Opacus' registries: per-sample gradients (hooks mode) and per-sample norms
    (ghost clipping) for Conv2d and timm's GroupNormAct, and the copy-free per-sample gradient store."""
    import opacus.grad_sample.grad_sample_module as gsm
    import opacus.grad_sample.grad_sample_module_fast_gradient_clipping as gsm_fast
    from opacus.grad_sample import GradSampleModule
    from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import GradSampleModuleFastGradientClipping
    from timm.layers import GroupNormAct

    if "slots" not in _OPACUS_DEFAULTS:
        _OPACUS_DEFAULTS["slots"] = [table.get(key) for table, key in _opacus_slots()]
    GradSampleModule.GRAD_SAMPLERS[nn.Conv2d] = _conv2d_grad_sample
    GradSampleModule.GRAD_SAMPLERS[GroupNormAct] = _group_norm_act_grad_sample
    GradSampleModuleFastGradientClipping.NORM_SAMPLERS[nn.Conv2d] = _conv2d_norm_sample
    GradSampleModuleFastGradientClipping.NORM_SAMPLERS[GroupNormAct] = _group_norm_act_norm_sample
    GradSampleModule.GRAD_SAMPLERS[PrefixTokenPosEmbed] = _token_embed_grad_sample
    GradSampleModuleFastGradientClipping.NORM_SAMPLERS[PrefixTokenPosEmbed] = _token_embed_norm_sample
    gsm.create_or_accumulate_grad_sample = _store_grad_sample
    gsm_fast.create_or_accumulate_grad_sample = _store_grad_sample


register_fast_grad_samplers()


@dataclass
class PrivateTraining:
    """What :func:`make_private` returns: the wrapped model, DP optimizer, loader of index batches, criterion."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: torch.utils.data.DataLoader
    criterion: nn.Module
    sample_rate: float


def make_private(model: nn.Module, optimizer: torch.optim.Optimizer, num_samples: int, batch_size: int, *,
                 noise_multiplier: float, max_grad_norm: float, grad_sample_mode: str = "hooks",
                 seed: int = 0, poisson_sampling: bool = True,
                 noise: NoiseSource | None = None) -> PrivateTraining:
    """Opacus' ``PrivacyEngine.make_private`` over a loader of *indices* 0..n-1.

    The loader yields index batches (Poisson-sampled with rate q = batch_size / n when
    ``poisson_sampling``), so the caller fetches and augments the images itself.

    Threat model: the noise (and, for amplification by subsampling, the batch sampling) hides a
    client's examples from the server and everyone downstream, so both come from ``noise``, the
    client's own secret source (privacy.randomness: OS entropy by default), never from ``seed``,
    which the server chose. With a seeded source (a local seed file) ``seed`` is mixed in, so
    the same file and seed give the same batches and noise.
    """
    from opacus import PrivacyEngine

    if max_grad_norm <= 0:
        raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if noise_multiplier == 0:
        warnings.warn("DP-SGD with noise_multiplier = 0: clipping only, epsilon is infinite", stacklevel=2)
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, got {grad_sample_mode!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    batch_size = min(batch_size, num_samples)
    noise = noise or NoiseSource()
    g_data = torch.Generator().manual_seed(noise.torch_seed(STREAM_DPSGD, seed, 0))
    device = next(model.parameters()).device
    g_noise = torch.Generator(device=device).manual_seed(noise.torch_seed(STREAM_DPSGD, seed, 1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(num_samples)),
                                         batch_size=batch_size, shuffle=not poisson_sampling, generator=g_data)
    criterion = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
        warnings.filterwarnings("ignore", message=".*Full backward hook.*")
        out = PrivacyEngine().make_private(
            module=model, optimizer=optimizer, data_loader=loader, criterion=criterion,
            noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, poisson_sampling=poisson_sampling,
            grad_sample_mode=grad_sample_mode, noise_generator=g_noise)
    if grad_sample_mode == "ghost":
        wrapped, opt, criterion, dl = out
    else:
        wrapped, opt, dl = out
    # Opacus sets q = 1 / len(loader) = 1 / ceil(n / B) (not B / n) and 1 / q steps per epoch.
    rate = float(getattr(dl, "sample_rate", 1.0 / len(loader)))
    return PrivateTraining(wrapped, opt, dl, criterion, rate)


def ghost_clipping_backward(model: nn.Module, loss_per_sample: torch.Tensor, inputs: torch.Tensor) -> None:
    """Two-pass ghost clipping (as Opacus' ``DPLossFastGradientClipping.backward``) leaving p.grad = the sum of
    clipped per-sample gradients; the DP optimizer then adds noise and averages.

    Pass 1 differentiates only w.r.t. ``inputs`` (which must require grad): the hooks need each layer's
    output gradient to compute per-sample gradient norms, not the parameter gradients that Opacus
    computes in this pass and throws away. Pass 2 backpropagates the clip-weighted loss without hooks.
    """
    if not inputs.requires_grad:
        raise ValueError("ghost_clipping_backward: inputs must require grad")
    torch.autograd.grad(loss_per_sample.mean(), inputs, retain_graph=True)  # the module uses loss_reduction="mean"
    coeff = model.get_clipping_coef()
    model.disable_hooks()
    try:
        (coeff.to(loss_per_sample.device) * loss_per_sample).sum().backward()
    finally:
        model.enable_hooks()


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside an Opacus wrapper (state-dict keys without '_module.')."""
    return getattr(model, "_module", model)


# ----------------------------------------------------------------------------- accounting
@dataclass(frozen=True)
class DpSgdEvent:
    """``steps`` Poisson-subsampled Gaussian steps with rate ``sample_rate`` and ``noise_multiplier``."""

    noise_multiplier: float
    sample_rate: float
    steps: int


class DpSgdLedger:
    """Records a client's DP-SGD events; :func:`rdp_epsilon` computes from it."""

    def __init__(self) -> None:
        self.events: list[DpSgdEvent] = []

    def record(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if steps:
            self.events.append(DpSgdEvent(float(noise_multiplier), float(sample_rate), int(steps)))

    @property
    def total_steps(self) -> int:
        return sum(e.steps for e in self.events)


def dp_event(events: list[DpSgdEvent]) -> dp_accounting.DpEvent:
    """The composed DpEvent of a ledger (events with the same (sigma, q) merged: composition is additive)."""
    steps: dict[tuple[float, float], int] = {}
    for e in events:
        steps[(e.noise_multiplier, e.sample_rate)] = steps.get((e.noise_multiplier, e.sample_rate), 0) + e.steps
    return dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), t)
        for (z, q), t in steps.items()])


def rdp_epsilon(events: list[DpSgdEvent], delta: float) -> float:
    """Epsilon at ``delta`` from dp-accounting's RDP accountant; inf if any step had no noise."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not events:
        return 0.0
    if any(e.noise_multiplier == 0 for e in events):
        return math.inf
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_event(events))
    return float(acc.get_epsilon(delta))


def paper_sqrt_t_bound(noise_multiplier: float, steps: int, delta: float) -> float:
    """The paper's basic-composition estimate: eps_step * sqrt(T) with the classic Gaussian-mechanism
    eps_step = sqrt(2 ln(1.25 / delta)) / sigma, T = number of DP-SGD steps.

    Reported beside the accountant's value for comparison with the paper only: it ignores
    subsampling amplification and is not an (eps, delta) guarantee for T > 1.
    """
    if noise_multiplier <= 0:
        return math.inf
    return math.sqrt(steps) * math.sqrt(2 * math.log(1.25 / delta)) / noise_multiplier
