"""Ultrasound preprocessing and client-specific feature-skew augmentation.

Preprocessing (ultrasound study, Sec. "Preprocessing"): grayscale, bicubic resize to the
configured size (224 in the paper), CLAHE with clip limit 2.0 (OpenCV), a 3x3 Gaussian
blur, then -- per batch -- replication to 3 channels and ImageNet normalization.

The expensive, deterministic part (:func:`preprocess_ultrasound`) runs once per image and
is stored as uint8 ``(H, W)``; :func:`to_model_input` does the cheap per-batch part, so a
feature-skew augmentation (:class:`ScannerProfile`) can act on [0, 1] intensities in between.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLAHE_CLIP_LIMIT = 2.0
CLAHE_TILE_GRID = (8, 8)  # OpenCV's default grid
BLUR_KERNEL = (3, 3)


def to_gray_uint8(img: np.ndarray) -> np.ndarray:
    """(H, W), (H, W, 1), (H, W, 3) or (H, W, 4) uint8 -> (H, W) uint8 grayscale."""
    img = np.asarray(img)
    if img.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got dtype {img.dtype}")
    if img.ndim == 2:
        return img
    if img.ndim == 3 and img.shape[2] == 1:
        return img[:, :, 0]
    if img.ndim == 3 and img.shape[2] == 3:
        return cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    if img.ndim == 3 and img.shape[2] == 4:
        return cv2.cvtColor(img, cv2.COLOR_RGBA2GRAY)
    raise ValueError(f"expected an image of shape (H, W) or (H, W, 1|3|4), got {img.shape}")


def preprocess_ultrasound(img: np.ndarray, size: int) -> np.ndarray:
    """Grayscale -> bicubic resize to ``size`` x ``size`` -> CLAHE(2.0) -> 3x3 Gaussian blur; uint8 (size, size)."""
    if size < 8:
        raise ValueError(f"image size must be >= 8, got {size}")
    gray = to_gray_uint8(img)
    if gray.shape != (size, size):
        gray = cv2.resize(gray, (size, size), interpolation=cv2.INTER_CUBIC)
    clahe = cv2.createCLAHE(clipLimit=CLAHE_CLIP_LIMIT, tileGridSize=CLAHE_TILE_GRID)
    return cv2.GaussianBlur(clahe.apply(gray), BLUR_KERNEL, 0)


def preprocess_many(images: list[np.ndarray] | np.ndarray, size: int) -> np.ndarray:
    """:func:`preprocess_ultrasound` over a list of images; uint8 (n, size, size)."""
    out = np.empty((len(images), size, size), dtype=np.uint8)
    for i, img in enumerate(images):
        out[i] = preprocess_ultrasound(img, size)
    return out


def to_model_input(x01: torch.Tensor) -> torch.Tensor:
    """(n, H, W) or (n, 1, H, W) intensities in [0, 1] -> (n, 3, H, W) ImageNet-normalized float."""
    if x01.ndim == 3:
        x01 = x01.unsqueeze(1)
    if x01.ndim != 4 or x01.shape[1] != 1:
        raise ValueError(f"expected (n, H, W) or (n, 1, H, W), got {tuple(x01.shape)}")
    mean = torch.tensor(IMAGENET_MEAN, dtype=x01.dtype, device=x01.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=x01.dtype, device=x01.device).view(1, 3, 1, 1)
    return (x01.expand(-1, 3, -1, -1) - mean) / std


def uint8_to_unit(x: torch.Tensor) -> torch.Tensor:
    """uint8 tensor -> float32 in [0, 1]."""
    return x.float().div_(255.0)


@dataclass(frozen=True)
class ScannerProfile:
    """One client's augmentation ranges (feature skew mimicking scanner differences).

    Each training image gets a brightness offset, a contrast factor and a rotation drawn
    uniformly from this client's ranges. Ranges differ between clients in *centre* (a
    scanner's systematic gain/contrast) and *width* (its variability).
    """

    brightness: tuple[float, float]  # additive offset on [0, 1] intensities
    contrast: tuple[float, float]  # multiplicative factor around the image mean
    rotation_deg: float  # maximum absolute rotation

    def __post_init__(self) -> None:
        if not (self.brightness[0] <= self.brightness[1] and self.contrast[0] <= self.contrast[1]):
            raise ValueError(f"ranges must be (low, high) with low <= high, got {self}")
        if self.contrast[0] <= 0:
            raise ValueError(f"contrast factors must be > 0, got {self.contrast}")
        if not 0 <= self.rotation_deg <= 180:
            raise ValueError(f"rotation_deg must be in [0, 180], got {self.rotation_deg}")

    def to_dict(self) -> dict:
        return asdict(self)

    def apply(self, x01: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment a batch (n, 1, H, W) in [0, 1]; draws come from ``generator`` (CPU)."""
        n = x01.shape[0]

        def draw(lo: float, hi: float) -> torch.Tensor:
            u = torch.rand(n, generator=generator)
            return (lo + (hi - lo) * u).to(x01.device, x01.dtype).view(n, 1, 1, 1)

        b = draw(*self.brightness)
        c = draw(*self.contrast)
        angle = draw(-self.rotation_deg, self.rotation_deg).view(n) * (math.pi / 180)
        mean = x01.mean(dim=(1, 2, 3), keepdim=True)
        x = ((x01 - mean) * c + mean + b).clamp_(0.0, 1.0)
        if self.rotation_deg > 0:
            cos, sin = torch.cos(angle), torch.sin(angle)
            zero = torch.zeros_like(cos)
            theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
            grid = F.affine_grid(theta, list(x.shape), align_corners=False)
            x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return x


IDENTITY_PROFILE = ScannerProfile((0.0, 0.0), (1.0, 1.0), 0.0)


def scanner_profiles(num_clients: int, rng: np.random.Generator, strength: float = 1.0) -> list[ScannerProfile]:
    """Client-specific augmentation ranges, one per client (feature skew).

    Centres spread over brightness [-0.15, 0.15] and contrast [0.75, 1.25] (scaled by
    ``strength``), widths and maximum rotations (up to 20 degrees) vary per client; all
    drawn from ``rng``, so the same seed gives the same "scanners".
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if strength < 0:
        raise ValueError(f"strength must be >= 0, got {strength}")
    profiles = []
    for _ in range(num_clients):
        b0 = rng.uniform(-0.15, 0.15) * strength
        bw = rng.uniform(0.0, 0.1) * strength
        c0 = 1.0 + rng.uniform(-0.25, 0.25) * strength
        cw = rng.uniform(0.0, 0.15) * strength
        rot = float(rng.uniform(0.0, 20.0) * strength)
        profiles.append(ScannerProfile((b0 - bw, b0 + bw), (max(c0 - cw, 0.05), c0 + cw), min(rot, 180.0)))
    return profiles


def normalize_images(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 (n, H, W) or (n, H, W, C) -> float (n, C, H, W), scaled to [0, 1] then standardized per channel."""
    t = torch.from_numpy(x).float().div_(255.0)
    t = t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
    return ((t - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)).contiguous()
