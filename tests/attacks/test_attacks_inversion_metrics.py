"""Reconstruction metrics, per-seed aggregation and the reconstruction grid figure."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from matplotlib.image import imread
from skimage.metrics import structural_similarity

from attacks.inversion.figures import GridRow, save_reconstruction_grid
from attacks.inversion.metrics import (
    PSNR_CAP_DB,
    aggregate_over_seeds,
    mse,
    psnr,
    score_reconstruction,
    ssim,
    unnormalize,
)
from attacks.inversion.registry import InversionResult


def _rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


def test_identical_images_score_perfectly() -> None:
    a = _rand((3, 8, 8), 0)
    assert mse(a, a) == 0.0
    assert psnr(a, a) == PSNR_CAP_DB  # capped, documented, keeps seed means finite
    assert ssim(a, a) == pytest.approx(1.0)


def test_hand_computed_mse_and_psnr() -> None:
    a, b = np.zeros((1, 8, 8)), np.full((1, 8, 8), 0.5)
    assert mse(a, b) == 0.25
    assert psnr(a, b) == pytest.approx(10 * math.log10(4.0))


@pytest.mark.parametrize("shape", [(8, 8), (1, 8, 8), (3, 8, 8), (3, 16, 12)])
def test_ssim_matches_skimage_with_explicit_data_range(shape: tuple[int, ...]) -> None:
    a, b = _rand(shape, 1), _rand(shape, 2) * 0.5 + _rand(shape, 1) * 0.5
    kw = {"channel_axis": 0} if len(shape) == 3 and shape[0] == 3 else {}
    ref = structural_similarity(np.squeeze(a, 0) if shape[0] == 1 else a, np.squeeze(b, 0) if shape[0] == 1 else b,
                                data_range=1.0, **kw)  # fmt: skip
    assert ssim(b, a) == pytest.approx(ref)
    assert 0.0 < ssim(b, a) < 1.0


def test_unnormalize_and_score_reconstruction() -> None:
    mean, std = (0.5, 0.4, 0.3), (0.5, 0.2, 0.1)
    x = torch.zeros(3, 4, 4)
    np.testing.assert_allclose(unnormalize(x, mean, std)[:, 0, 0], mean)
    np.testing.assert_allclose(unnormalize(torch.full((3, 4, 4), 100.0), mean, std), 1.0)  # clipped
    original = (torch.full((3, 4, 4), 0.5) - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    result = InversionResult("idlg", original.clone(), 2, 0.0, (0.0,), 0)
    s = score_reconstruction(result, original[None], mean, std, true_label=2)
    assert s == {"mse": 0.0, "psnr": PSNR_CAP_DB, "ssim": pytest.approx(1.0), "label_correct": 1.0}
    assert score_reconstruction(result, original, mean, std, true_label=0)["label_correct"] == 0.0
    with pytest.raises(ValueError, match="original"):
        score_reconstruction(result, torch.zeros(3, 5, 5), mean, std)
    with pytest.raises(ValueError, match="mean and std"):
        unnormalize(x, (0.5, 0.5), (0.5, 0.5))


def test_aggregate_averages_within_seed_before_summarizing() -> None:
    rows = [{"framework": "fl", "condition": "dp", "attack": "idlg", "seed": 0, "ssim": v} for v in (0.1, 0.2, 0.3)]
    rows.append({"framework": "fl", "condition": "dp", "attack": "idlg", "seed": 1, "ssim": 0.8})
    rows.append({"framework": "fl", "condition": "none", "attack": "idlg", "seed": 0, "ssim": 0.9})
    with pytest.warns(UserWarning, match="one seed"):  # the "none" group has a single seed
        out = aggregate_over_seeds(rows, metrics=("ssim", "psnr"))
    assert len(out) == 2
    dp = out[0]
    # Seed means 0.2 and 0.8 -> 0.5 (pooling the four rows would give 0.35).
    assert dp["ssim_mean"] == pytest.approx(0.5)
    assert dp["ssim_sd"] == pytest.approx(float(np.std([0.2, 0.8], ddof=1)))
    assert dp["n_seeds"] == 2 and dp["n_gradients"] == 4 and "psnr_mean" not in dp
    with pytest.raises(ValueError, match="lacks keys"):
        aggregate_over_seeds([{"seed": 0, "ssim": 1.0}])


def test_reconstruction_grid_is_written_atomically(tmp_path) -> None:
    img = torch.zeros(1, 8, 8)
    rows = [
        GridRow("fl", "no-dp", img, {"dlg": img + 1, "idlg": img - 1}),
        GridRow("sequential-dfl", "eps=2", img, {"dlg": img}),
    ]
    out = save_reconstruction_grid(tmp_path / "fig" / "grid.png", rows, ["dlg", "idlg", "invgrad"], (0.5,), (0.5,), dpi=50)
    assert out.exists() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(out.parent) == ["grid.png"]  # no temp file left behind
    h, w = imread(out).shape[:2]
    assert w > h  # 4 columns, 2 rows
    with pytest.raises(ValueError, match="path"):
        save_reconstruction_grid(tmp_path / "grid.jpg", rows, ["dlg"], (0.5,), (0.5,))
