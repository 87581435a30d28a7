"""Making timm models Opacus-compatible; every change is returned as a :class:`ModelChange` so runs can report it.

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
  network per sample (functorch) for them; they move into a leaf module (values kept) that
  :mod:`privacy.dpsgd.samplers` has a sampler for. The model stays timm's own object and class; it
  calls the leaf through a forward hook (:mod:`privacy.dpsgd.timm_adapter`, the one place that relies
  on how timm's ViT adds its tokens).
* timm's ``RelPosBias`` (CoAtNet) has trainable tables next to buffers, which Opacus
  cannot compute per-sample gradients for: its tables are frozen (kept at their
  initial / pretrained values) and reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from privacy.dpsgd.timm_adapter import route_tokens_through


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
    """Replace every timm ``BatchNormAct2d`` by ``GroupNormAct`` in place (same act/drop, affine weights copied).

    Parameters
    ----------
    model : nn.Module
        Searched recursively; changed in place.
    prefix : str
        Dotted path of ``model`` inside the root module (for the reported changes).

    Returns
    -------
    list of ModelChange
        One entry per replaced layer.
    """
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
    their per-sample gradients are slices of the output gradient
    (:func:`privacy.dpsgd.samplers.token_embed_grad_sample`).
    Computes cat([cls, x], 1) + pos_embed, timm's default (class token inside the position table).
    """

    def __init__(self, cls_token: nn.Parameter, pos_embed: nn.Parameter) -> None:
        super().__init__()
        self.cls_token = cls_token
        self.pos_embed = pos_embed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed


def _move_vit_tokens(model: nn.Module) -> list[ModelChange]:
    """Move a timm ViT's cls_token / pos_embed into a :class:`PrefixTokenPosEmbed` child (values kept)."""
    if type(model) is not VisionTransformer or model.cls_token is None or model.pos_embed is None:
        return []
    if model.reg_token is not None or model.no_embed_class or model.dynamic_img_size:
        return []  # other token layouts: left to Opacus' functorch fallback
    cls_token, pos_embed = model.cls_token, model.pos_embed
    del model.cls_token, model.pos_embed
    model.cls_token = model.pos_embed = None
    route_tokens_through(model, PrefixTokenPosEmbed(cls_token, pos_embed))  # same object, timm's class (a hook)
    return [ModelChange("cls_token, pos_embed", "parameters of the ViT itself", "token_embed (PrefixTokenPosEmbed)",
                        "Opacus would recompute the whole network per sample for parameters of the root module")]


BN_MODES = ("groupnorm", "frozen")


def freeze_batchnorm(model: nn.Module) -> tuple[nn.Module, list[ModelChange]]:
    """Every BatchNorm (incl. timm's fused ``BatchNormAct2d``) -> timm's frozen affine twin, in eval form.

    ``timm.layers.freeze_batch_norm_2d``: the running statistics *and* gamma / beta become buffers and
    every forward uses the stored statistics, so no example's output depends on another's (what DP-SGD's
    per-example sensitivity needs) and the pretrained normalisation is kept -- the usual choice when
    fine-tuning a pretrained network with DP (e.g. De et al. 2022, Mehta et al. 2023 freeze or drop BN
    statistics). Returns the converted model (the root itself may be replaced) and one change record.
    """
    from timm.layers import freeze_batch_norm_2d

    kinds = {n: type(m).__name__ for n, m in model.named_modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    model = freeze_batch_norm_2d(model)
    if kinds:
        names = sorted(set(kinds.values()))
        return model, [ModelChange("*", f"{len(kinds)} x {'/'.join(names)}", "FrozenBatchNorm(Act)2d",
                                   "frozen ImageNet statistics and affine: eval-mode BN mixes no examples")]
    return model, []


def train_last_groups(model: nn.Module, num_groups: int) -> ModelChange:
    """Freeze every parameter except the last ``num_groups`` layer groups of timm's fine ``group_matcher``.

    For EfficientNet-Lite0 the last three groups are blocks 5.3, 6.0 with the head conv, and the classifier
    (about 1.5 M of 3.4 M parameters).
    """
    from timm.models import group_parameters

    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if not hasattr(model, "group_matcher"):
        raise ValueError(f"{type(model).__name__} has no timm group_matcher; cannot select its last layers")
    groups = group_parameters(model, cast(Callable[..., Any], model.group_matcher)(coarse=False))
    order = sorted(groups)
    keep = {n for g in order[-num_groups:] for n in groups[g]}
    for n, p in model.named_parameters():
        p.requires_grad_(n in keep)
    n_keep = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return ModelChange("*", "all layers trained", f"last {num_groups} layer groups trained ({n_keep} parameters)",
                       "fine-tune only the last layers: fewer noised coordinates under DP-SGD")


def make_opacus_compatible(model: nn.Module, bn: str = "groupnorm") -> tuple[nn.Module, list[ModelChange]]:
    """Fix a (timm) model so that Opacus can compute its per-sample gradients.

    Parameters
    ----------
    model : nn.Module
        Changed in place where possible (``ModuleValidator.fix`` may return a copy).
    bn : {"groupnorm", "frozen"}
        BatchNorm layers become GroupNorm (trained; the pretrained statistics are lost) or frozen
        affine layers with the stored statistics (:func:`freeze_batchnorm`).

    Returns
    -------
    model : nn.Module
        The fixed model (use this one).
    changes : list of ModelChange
        What was changed and why, for the run's report.

    Raises
    ------
    ValueError
        If Opacus' validator still refuses the fixed model.
    """
    from opacus.validators import ModuleValidator

    if bn not in BN_MODES:
        raise ValueError(f"bn must be one of {BN_MODES}, got {bn!r}")
    changes: list[ModelChange] = []
    if bn == "frozen":
        model, changes = freeze_batchnorm(model)
    changes += replace_batchnorm_act(model) + _move_vit_tokens(model)
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
            cast(Any, m).inplace = False  # a plain attribute (nn.Module's __setattr__ is typed for Tensor | Module)
            n_inplace += 1
    if n_inplace:
        changes.append(ModelChange("*", f"{n_inplace} in-place activations", "out-of-place",
                                   "Opacus' backward hooks refuse in-place ops on hooked outputs"))
    errors = ModuleValidator.validate(model.train(), strict=False)  # Opacus validates in training mode
    if errors:
        raise ValueError(f"model is still not Opacus-compatible after fixing: {errors[:3]}")
    return model, changes
