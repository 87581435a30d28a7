"""Inversion attacks: registry contract, proof that they work, and that noise defeats them."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attacks.inversion import (
    ATTACKS,
    AdversaryView,
    InversionConfig,
    bounds_from_normalization,
    capture_single_example_gradient,
    register_attack,
    run_attack,
    view_from_noised_update,
)
from attacks.inversion.metrics import random_image_mse, score_reconstruction

MEAN, STD = (0.5,), (0.5,)
K = 10


def lenet16() -> nn.Module:
    """The DLG paper's sigmoid LeNet, sized for 1x16x16 inputs."""
    return nn.Sequential(
        nn.Conv2d(1, 12, 5, padding=2, stride=2), nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid(),
        nn.Flatten(), nn.Linear(192, K),
    )  # fmt: skip


def rgb_net() -> nn.Module:
    """A 3-channel, 5-class net for the shape contract."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Sigmoid(), nn.Flatten(), nn.Linear(4 * 8 * 8, 5))


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _dlg_init(model: nn.Module) -> nn.Module:
    # DLG's weights_init: U(-0.5, 0.5), from an explicit generator.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return model


def _smooth_image() -> torch.Tensor:
    """A smooth 16x16 pattern in [0, 1], normalized with MEAN/STD; shape (1, 1, 16, 16)."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, 16), torch.linspace(-1, 1, 16), indexing="ij")
    img = (0.5 + 0.4 * torch.sin(3 * xx) * torch.cos(2 * yy)).clamp(0, 1)
    return ((img - MEAN[0]) / STD[0]).reshape(1, 1, 16, 16)


TRUE_LABEL = 3


@pytest.fixture(scope="module")
def lenet_setup() -> tuple[nn.Module, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        model = _dlg_init(lenet16())
    return model, _smooth_image()


def _noised_view(model: nn.Module, x: torch.Tensor, clip_norm: float, sigma: float) -> AdversaryView:
    lr = 0.1
    grad = capture_single_example_gradient(model, x, TRUE_LABEL)
    update = [-lr * g for g in grad]  # one plain SGD step on the example
    return view_from_noised_update(
        lenet16, model.state_dict(), update, lr=lr, clip_norm=clip_norm, sigma=sigma,
        generator=torch.Generator().manual_seed(1), input_shape=(1, 16, 16), num_classes=K,
    )  # fmt: skip


def test_idlg_recovers_label_and_image_from_a_clean_gradient(lenet_setup) -> None:
    model, x = lenet_setup
    gradient = tuple(capture_single_example_gradient(model, x, TRUE_LABEL))
    view = AdversaryView(lenet16, model.state_dict(), gradient, (1, 16, 16), K)
    result = run_attack("idlg", view, InversionConfig(iterations=100, restarts=2, seed=0))
    scores = score_reconstruction(result, x[0], MEAN, STD, true_label=TRUE_LABEL)
    assert scores["label_correct"] == 1.0
    assert scores["ssim"] > 0.8, scores
    assert scores["psnr"] > 25.0, scores


def test_invgrad_is_scale_invariant_so_clipping_alone_does_not_stop_it(lenet_setup) -> None:
    model, x = lenet_setup
    view = _noised_view(model, x, clip_norm=1e-3, sigma=0.0)
    cfg = InversionConfig(iterations=150, restarts=1, pixel_bounds=bounds_from_normalization(MEAN, STD))
    scores = score_reconstruction(run_attack("invgrad", view, cfg), x[0], MEAN, STD, true_label=TRUE_LABEL)
    assert scores["label_correct"] == 1.0 and scores["ssim"] > 0.8, scores


@pytest.mark.parametrize("name", ["idlg", "invgrad"])
def test_heavy_noise_drives_reconstruction_to_chance(lenet_setup, name: str) -> None:
    model, x = lenet_setup
    cfg = InversionConfig(iterations=60, restarts=1, pixel_bounds=bounds_from_normalization(MEAN, STD))
    chance_mse = random_image_mse(x[0], MEAN, STD, torch.Generator().manual_seed(0))
    # Same pipeline without noise: the attack gets a recognizable image (so the test can fail).
    clean = score_reconstruction(run_attack(name, _noised_view(model, x, 1.0, 0.0), cfg), x[0], MEAN, STD)
    assert clean["ssim"] > 0.5 and clean["mse"] < 0.5 * chance_mse, clean
    # Clipped update norm 1 against noise norm ~ 5 * sqrt(9.4e3) ~ 480.
    noisy = score_reconstruction(run_attack(name, _noised_view(model, x, 1.0, 5.0), cfg), x[0], MEAN, STD)
    assert abs(noisy["ssim"]) < 0.2, noisy
    assert noisy["mse"] > 0.5 * chance_mse, (noisy, chance_mse)


# --- contract shared by every registered attack ---------------------------------------


@pytest.fixture(scope="module")
def rgb_view() -> AdversaryView:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = rgb_net()
    x = torch.randn((1, 3, 8, 8), generator=torch.Generator().manual_seed(2))
    return AdversaryView(rgb_net, model.state_dict(), tuple(capture_single_example_gradient(model, x, 4)), (3, 8, 8), 5)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_contract(rgb_view: AdversaryView, name: str) -> None:
    bounds = bounds_from_normalization((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    cfg = InversionConfig(iterations=8, restarts=3, seed=5, pixel_bounds=bounds)
    rng_before = torch.random.get_rng_state()
    a = run_attack(name, rgb_view, cfg)
    b = run_attack(name, rgb_view, cfg)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # global RNG untouched
    assert a.attack == name and a.reconstruction.shape == (3, 8, 8)
    assert 0 <= a.label < 5
    assert len(a.restart_objectives) == 3 and a.objective == min(a.restart_objectives)
    assert a.restart_objectives[a.best_restart] == a.objective and math.isfinite(a.objective)
    assert len(set(a.restart_objectives)) > 1  # restarts start from different points
    assert a.evaluations >= 3
    assert torch.equal(a.reconstruction, b.reconstruction) and a.restart_objectives == b.restart_objectives
    c = run_attack(name, rgb_view, InversionConfig(iterations=8, restarts=3, seed=6, pixel_bounds=bounds))
    assert not torch.equal(a.reconstruction, c.reconstruction)


def test_invgrad_respects_the_pixel_box(rgb_view: AdversaryView) -> None:
    low, high = bounds_from_normalization((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    r = run_attack("invgrad", rgb_view, InversionConfig(iterations=10, restarts=1, pixel_bounds=(low, high)))
    for c in range(3):
        assert r.reconstruction[c].min() >= low[c] - 1e-6 and r.reconstruction[c].max() <= high[c] + 1e-6


def test_known_label_in_view_is_used(rgb_view: AdversaryView) -> None:
    view = AdversaryView(rgb_view.model_factory, rgb_view.state_dict, rgb_view.gradient, (3, 8, 8), 5, label=1)
    assert run_attack("idlg", view, InversionConfig(iterations=2, restarts=1)).label == 1


def test_registry_refuses_duplicates_and_unknown_names(rgb_view: AdversaryView) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_attack("dlg")(lambda ctx, gen: None)
    with pytest.raises(ValueError, match="name must be a registered attack"):
        run_attack("nope", rgb_view)
    with pytest.raises(ValueError, match="iterations"):
        InversionConfig(iterations=0)
    with pytest.raises(ValueError, match="pixel_bounds"):
        run_attack("invgrad", rgb_view, InversionConfig(iterations=1, pixel_bounds=((0.0, 0.0), (1.0, 1.0))))
