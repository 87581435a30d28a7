"""Preprocessing (resize, CLAHE, blur, normalization) and feature-skew augmentation."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from datasets.transforms import (
    IDENTITY_PROFILE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ScannerProfile,
    preprocess_many,
    preprocess_ultrasound,
    scanner_profiles,
    to_gray_uint8,
    to_model_input,
)


@pytest.fixture
def image():
    rng = np.random.default_rng(0)
    gray = (np.linspace(0, 200, 48)[None, :] + rng.normal(0, 20, (40, 48))).clip(0, 255).astype(np.uint8)
    return np.repeat(gray[:, :, None], 3, axis=2)  # RGB like the shared BUSI PNGs


def test_preprocess_matches_independent_opencv_pipeline(image):
    out = preprocess_ultrasound(image, 32)
    assert out.shape == (32, 32) and out.dtype == np.uint8
    ref = cv2.resize(image[:, :, 0], (32, 32), interpolation=cv2.INTER_CUBIC)
    ref = cv2.createCLAHE(clipLimit=2.0, tileGridSize=(8, 8)).apply(ref)
    ref = cv2.GaussianBlur(ref, (3, 3), 0)
    np.testing.assert_array_equal(out, ref)


def test_preprocess_is_not_a_plain_resize(image):
    """CLAHE + blur change the image: a wrong pipeline (resize only, or bilinear) must not pass."""
    out = preprocess_ultrasound(image, 32).astype(int)
    plain = cv2.resize(image[:, :, 0], (32, 32), interpolation=cv2.INTER_CUBIC).astype(int)
    assert np.abs(out - plain).mean() > 2
    bilinear = cv2.resize(image[:, :, 0], (32, 32), interpolation=cv2.INTER_LINEAR)
    bl = cv2.GaussianBlur(cv2.createCLAHE(2.0, (8, 8)).apply(bilinear), (3, 3), 0)
    assert not np.array_equal(out, bl)


def test_gray_conversion_and_bad_input():
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[..., 0] = 255  # pure red -> 0.299 * 255
    assert int(to_gray_uint8(rgb)[0, 0]) == 76
    assert to_gray_uint8(np.zeros((4, 4, 1), np.uint8)).shape == (4, 4)
    with pytest.raises(ValueError, match="uint8"):
        to_gray_uint8(np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="shape"):
        to_gray_uint8(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(ValueError, match=">= 8"):
        preprocess_ultrasound(np.zeros((4, 4), np.uint8), 4)


def test_model_input_replicates_and_normalizes():
    x = torch.full((2, 5, 5), 0.5)
    out = to_model_input(x)
    assert out.shape == (2, 3, 5, 5)
    for c in range(3):
        assert torch.allclose(out[:, c], torch.tensor((0.5 - IMAGENET_MEAN[c]) / IMAGENET_STD[c]))
    assert preprocess_many([np.zeros((20, 20), np.uint8)] * 3, 16).shape == (3, 16, 16)


def test_identity_profile_and_fixed_brightness_contrast():
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.25
    g = torch.Generator().manual_seed(1)
    assert torch.allclose(IDENTITY_PROFILE.apply(x, g), x)
    shifted = ScannerProfile((0.1, 0.1), (1.0, 1.0), 0.0).apply(x, g)
    assert torch.allclose(shifted, x + 0.1, atol=1e-6)
    doubled = ScannerProfile((0.0, 0.0), (2.0, 2.0), 0.0).apply(x, g)
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    assert torch.allclose(doubled, ((x - mean) * 2 + mean).clamp(0, 1), atol=1e-6)


def test_rotation_turns_the_image_by_the_drawn_angle():
    n = 33
    yy, xx = torch.meshgrid(torch.arange(n, dtype=torch.float32), torch.arange(n, dtype=torch.float32), indexing="ij")
    x = torch.exp(-((yy - 6) ** 2 + (xx - 16) ** 2) / 4).view(1, 1, n, n)  # a blob above the centre
    prof = ScannerProfile((0.0, 0.0), (1.0, 1.0), 60.0)
    out = prof.apply(x, torch.Generator().manual_seed(3))
    u = torch.rand(3, 1, generator=torch.Generator().manual_seed(3))[2, 0]  # brightness, contrast, angle draws
    theta = float(-60 + 120 * u)
    w = out[0, 0]
    cy, cx = float((w * yy).sum() / w.sum()) - 16, float((w * xx).sum() / w.sum()) - 16
    turned = np.degrees(np.arctan2(cx, -cy))  # angle from "up", clockwise positive in image coordinates
    assert abs(abs(turned) - abs(theta)) < 4 and abs(theta) > 5
    assert torch.equal(out, prof.apply(x, torch.Generator().manual_seed(3)))  # seeded


def test_scanner_profiles_differ_per_client_and_are_seeded():
    a = scanner_profiles(8, np.random.default_rng(0))
    b = scanner_profiles(8, np.random.default_rng(0))
    assert a == b
    assert len({p.brightness for p in a}) == 8 and len({p.rotation_deg for p in a}) == 8
    assert all(-0.3 <= p.brightness[0] <= p.brightness[1] <= 0.3 and p.contrast[0] > 0 for p in a)
    assert scanner_profiles(2, np.random.default_rng(0), strength=0.0) == [IDENTITY_PROFILE, IDENTITY_PROFILE]
    with pytest.raises(ValueError, match="low <= high"):
        ScannerProfile((0.2, 0.1), (1.0, 1.0), 0.0)
