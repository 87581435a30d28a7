"""The ultrasound study's model registry: the paper's seven backbones as exact timm names.

``create_model`` replaces the classification head for the task (timm's ``num_classes``),
loads ImageNet weights when they are on this machine (a file in ``weights_dir``, the
Hugging Face cache or torch-hub's cache -- never a download), otherwise falls back to
random init with a warning, and under DP-SGD makes the model Opacus-compatible
(:func:`privacy.dpsgd.make_opacus_compatible`). What was used is returned in ``info``.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import timm
import torch
from torch import nn

from privacy.dpsgd import make_opacus_compatible

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchSpec:
    """A backbone: exact timm name, the paper's name, and input-size constraints."""

    timm_name: str
    paper_name: str
    takes_img_size: bool = False  # transformer: positional tables sized at build time
    size_multiple: int = 1
    min_size: int = 32


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
):
    register_arch(_spec)


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
        cands.append(Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(cfg.url))
    return next((c for c in cands if c.is_file()), None)


def _kwargs(arch: str, num_classes: int, image_size: int) -> dict:
    kw: dict = {"num_classes": num_classes}
    if ARCHS[arch].takes_img_size:
        kw["img_size"] = image_size
    return kw


@functools.lru_cache(maxsize=4)
def _skeleton(arch: str, num_classes: int, image_size: int, dp: bool) -> tuple[nn.Module, tuple]:
    model = timm.create_model(arch, pretrained=False, **_kwargs(arch, num_classes, image_size))
    changes: list = []
    if dp:
        model, changes = make_opacus_compatible(model)
    return model, tuple(changes)


def model_skeleton(arch: str, num_classes: int, image_size: int, dp: bool) -> nn.Module:
    """A fresh copy of the architecture (weights to be loaded by the caller); cached per process."""
    check_image_size(arch, image_size)
    return copy.deepcopy(_skeleton(arch, num_classes, image_size, dp)[0])


def create_model(arch: str, num_classes: int, image_size: int, *, dp: bool, pretrained: bool,
                 weights_dir: str = "", seed: int = 0) -> tuple[nn.Module, dict]:
    """The initial global model and a record of how it was built (for the results)."""
    check_image_size(arch, image_size)
    kw = _kwargs(arch, num_classes, image_size)
    path = find_local_weights(arch, weights_dir) if pretrained else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the head (and everything, without weights) is seeded
        if path is not None:
            model = timm.create_model(arch, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **kw)
            source = f"imagenet ({path})"
        else:
            model = timm.create_model(arch, pretrained=False, **kw)
            if pretrained:
                source = "random init (no local ImageNet weights found; offline, nothing downloaded)"
                log.warning("%s: no local ImageNet weights (looked in weights-dir=%r, the HF and torch-hub caches); "
                            "RANDOM INIT", arch, weights_dir)
            else:
                source = "random init (us-pretrained=false)"
    changes: list = []
    if dp:
        model, changes = make_opacus_compatible(model)
    info = {"timm_name": arch, "paper_name": ARCHS[arch].paper_name, "timm_version": timm.__version__,
            "timm_kwargs": kw, "weights": source, "pretrained_loaded": path is not None,
            "num_params": int(sum(p.numel() for p in model.parameters())),
            "num_trainable": int(sum(p.numel() for p in model.parameters() if p.requires_grad)),
            "dp_model_changes": [c.to_dict() for c in changes]}
    return model, info


def count_params(arch: str, num_classes: int, image_size: int, dp: bool = False) -> int:
    """|theta| (all parameters) of the architecture for the task."""
    return int(sum(p.numel() for p in _skeleton(arch, num_classes, image_size, dp)[0].parameters()))
