"""Model registry: every backbone exists in timm, takes the study's sizes, gets the task's head; weights fallback."""

from __future__ import annotations

import logging

import pytest
import timm
import torch

from flower_apps.ultrasound.models import ARCHS, check_image_size, create_model, find_local_weights, model_skeleton

torch.set_num_threads(1)
PAPER_BACKBONES = {"ResNet-50", "VGG16", "VGG19", "DenseNet-121", "MobileNetV2", "ViT-small", "CoAtNet"}


def test_registry_covers_the_paper_backbones_with_exact_timm_names():
    assert {s.paper_name for s in ARCHS.values() if s.in_paper} == PAPER_BACKBONES
    assert [n for n, s in ARCHS.items() if not s.in_paper] == ["efficientnet_lite0"]  # the CPU-scale eighth
    for name in ARCHS:
        assert timm.is_model(name)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("num_classes", [2, 3])
def test_head_and_forward_shape_on_meta_device(arch, num_classes):
    """Cheap for every backbone (VGG's 134M parameters are never allocated): build on 'meta', run shapes."""
    size = 64
    kw = {"img_size": size} if ARCHS[arch].takes_img_size else {}
    with torch.device("meta"):
        model = timm.create_model(arch, num_classes=num_classes, **kw)
        out = model(torch.empty(2, 3, size, size))
    assert tuple(out.shape) == (2, num_classes)
    assert model.get_classifier().out_features == num_classes


def test_real_forward_for_the_cpu_default():
    model = model_skeleton("mobilenetv2_100", 3, 32, dp=False)
    with torch.no_grad():
        assert model.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    other = model_skeleton("mobilenetv2_100", 3, 32, dp=False)
    assert other is not model  # a fresh copy each time (Opacus wraps and hooks it)


def test_image_size_constraints():
    check_image_size("vit_small_patch16_224", 64)
    with pytest.raises(ValueError, match="divisible by 16"):
        check_image_size("vit_small_patch16_224", 40)
    with pytest.raises(ValueError, match="divisible by 32"):
        check_image_size("coatnet_0_rw_224", 48)
    with pytest.raises(ValueError, match="unknown architecture"):
        check_image_size("resnet18", 64)


def test_offline_without_weights_falls_back_to_random_init_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        model, info = create_model("mobilenetv2_100", 2, 32, dp=False, pretrained=True, weights_dir=str(tmp_path))
    assert not info["pretrained_loaded"] and info["weights"].startswith("random init")
    assert "RANDOM INIT" in caplog.text
    assert info["timm_name"] == "mobilenetv2_100" and info["num_params"] > 2_000_000
    _, again = create_model("mobilenetv2_100", 2, 32, dp=False, pretrained=False, seed=0)
    assert again["weights"] == "random init (us-pretrained=false)"


def test_local_weights_file_is_loaded_and_head_replaced(tmp_path):
    torch.manual_seed(123)
    imagenet = timm.create_model("mobilenetv2_100", num_classes=1000)  # stands in for the ImageNet checkpoint
    torch.save(imagenet.state_dict(), tmp_path / "mobilenetv2_100.pth")
    assert find_local_weights("mobilenetv2_100", tmp_path) == tmp_path / "mobilenetv2_100.pth"
    model, info = create_model("mobilenetv2_100", 3, 32, dp=True, pretrained=True, weights_dir=str(tmp_path))
    assert info["pretrained_loaded"] and str(tmp_path) in info["weights"]
    torch.testing.assert_close(model.conv_stem.weight, imagenet.conv_stem.weight)  # body from the file
    assert model.classifier.out_features == 3  # head replaced
    # DP: norms converted after loading, the affine weights carried over, the change reported
    assert info["dp_model_changes"] and "GroupNormAct" in info["dp_model_changes"][0]["new"]
    torch.testing.assert_close(model.bn1.weight, imagenet.bn1.weight)


def test_same_seed_same_initial_model():
    a, _ = create_model("mobilenetv2_100", 2, 32, dp=False, pretrained=False, seed=4)
    b, _ = create_model("mobilenetv2_100", 2, 32, dp=False, pretrained=False, seed=4)
    c, _ = create_model("mobilenetv2_100", 2, 32, dp=False, pretrained=False, seed=5)
    torch.testing.assert_close(a.classifier.weight, b.classifier.weight)
    assert not torch.equal(a.classifier.weight, c.classifier.weight)
