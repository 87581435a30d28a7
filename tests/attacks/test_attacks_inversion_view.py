"""Adversary views: gradient capture, the noised-update variant, and iDLG label inference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attacks.inversion import (
    AdversaryView,
    capture_single_example_gradient,
    infer_label_from_gradient,
    update_from_states,
    view_from_noised_update,
)

K = 4


def tiny_net() -> nn.Module:
    """Conv -> ReLU -> dropout -> FC on 1x6x6 inputs (dropout exercises eval mode)."""
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5), nn.Linear(48, K))


def no_bias_net() -> nn.Module:
    """Last layer without bias, ReLU before it: the iDLG weight-row rule applies."""
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 8), nn.ReLU(), nn.Linear(8, K, bias=False))


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _seeded(factory, seed: int = 0) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()


def _example(seed: int = 0) -> torch.Tensor:
    return torch.randn((1, 1, 6, 6), generator=torch.Generator().manual_seed(seed))


def test_capture_matches_autograd_in_eval_mode_and_restores_mode() -> None:
    model = _seeded(tiny_net)
    model.train()
    x = _example()
    g1 = capture_single_example_gradient(model, x, 2)
    g2 = capture_single_example_gradient(model, x, torch.tensor(2))
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    model.eval()
    expected = torch.autograd.grad(F.cross_entropy(model(x), torch.tensor([2])), list(model.parameters()))
    for a, b, e in zip(g1, g2, expected):
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(a, b)  # deterministic despite dropout
    with pytest.raises(ValueError, match="x must"):
        capture_single_example_gradient(model, torch.randn(2, 1, 6, 6), 0)


def test_view_validates_gradient_against_architecture() -> None:
    model = _seeded(tiny_net)
    grad = capture_single_example_gradient(model, _example(), 1)
    view = AdversaryView(tiny_net, model.state_dict(), tuple(grad), (1, 6, 6), K)
    assert view.input_shape == (1, 6, 6) and view.label is None
    with pytest.raises(ValueError, match="gradient must have 4 tensors"):
        AdversaryView(tiny_net, model.state_dict(), tuple(grad[:-1]), (1, 6, 6), K)
    bad = (*grad[:-1], torch.zeros(K + 1))
    with pytest.raises(ValueError, match=r"parameter '4.bias'"):
        AdversaryView(tiny_net, model.state_dict(), bad, (1, 6, 6), K)
    with pytest.raises(ValueError, match="label"):
        AdversaryView(tiny_net, model.state_dict(), tuple(grad), (1, 6, 6), K, label=K)
    with pytest.raises(ValueError, match="input_shape"):
        AdversaryView(tiny_net, model.state_dict(), tuple(grad), (1, 0, 6), K)


def test_view_copies_its_inputs() -> None:
    model = _seeded(tiny_net)
    grad = capture_single_example_gradient(model, _example(), 1)
    view = AdversaryView(tiny_net, model.state_dict(), tuple(grad), (1, 6, 6), K)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    grad[0].add_(1.0)
    assert not torch.equal(view.state_dict["0.weight"], model.state_dict()["0.weight"])
    assert not torch.equal(view.gradient[0], grad[0])


def _sgd_update(factory, x: torch.Tensor, y: int, lr: float) -> tuple[dict, list[torch.Tensor], list[torch.Tensor]]:
    model = _seeded(factory)
    model.eval()  # no dropout: the update is exactly -lr * grad
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grad = capture_single_example_gradient(model, x, y)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    F.cross_entropy(model(x), torch.tensor([y])).backward()
    opt.step()
    return before, update_from_states(factory, before, model.state_dict()), grad


def test_noise_free_unclipped_update_gives_back_the_gradient() -> None:
    before, update, grad = _sgd_update(tiny_net, _example(), 3, lr=0.05)
    view = view_from_noised_update(
        tiny_net, before, update, lr=0.05, clip_norm=None, sigma=0.0,
        generator=torch.Generator().manual_seed(0), input_shape=(1, 6, 6), num_classes=K,
    )  # fmt: skip
    for a, b in zip(view.gradient, grad):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_clipping_bounds_the_observed_update_norm() -> None:
    before, update, _ = _sgd_update(tiny_net, _example(), 3, lr=0.05)
    norm = math.sqrt(sum(float(u.pow(2).sum()) for u in update))
    for clip in (norm / 10, norm * 10):
        view = view_from_noised_update(
            tiny_net, before, update, lr=0.05, clip_norm=clip, sigma=0.0,
            generator=torch.Generator().manual_seed(0), input_shape=(1, 6, 6), num_classes=K,
        )  # fmt: skip
        observed = math.sqrt(sum(float((0.05 * g).pow(2).sum()) for g in view.gradient))
        assert observed == pytest.approx(min(norm, clip), rel=1e-5)


def test_noise_has_the_requested_sd_and_follows_the_generator() -> None:
    before, update, _ = _sgd_update(tiny_net, _example(), 3, lr=0.05)
    kwargs = dict(lr=0.05, clip_norm=1e-9, sigma=0.3, input_shape=(1, 6, 6), num_classes=K)
    a = view_from_noised_update(tiny_net, before, update, generator=torch.Generator().manual_seed(7), **kwargs)
    b = view_from_noised_update(tiny_net, before, update, generator=torch.Generator().manual_seed(7), **kwargs)
    c = view_from_noised_update(tiny_net, before, update, generator=torch.Generator().manual_seed(8), **kwargs)
    noise = torch.cat([(-0.05 * g).flatten() for g in a.gradient]).double()
    # n = 226 coordinates: the sample SD has relative standard error 1/sqrt(2n) ~ 4.7 %.
    assert float(noise.std()) == pytest.approx(0.3, rel=0.2)
    assert abs(float(noise.mean())) < 4 * 0.3 / math.sqrt(noise.numel())
    assert all(torch.equal(x, y) for x, y in zip(a.gradient, b.gradient))
    assert not torch.equal(a.gradient[0], c.gradient[0])
    with pytest.raises(ValueError, match="sigma"):
        view_from_noised_update(tiny_net, before, update, generator=torch.Generator(), **{**kwargs, "sigma": -1.0})
    with pytest.raises(ValueError, match="clip_norm"):
        view_from_noised_update(tiny_net, before, update, generator=torch.Generator(), **{**kwargs, "clip_norm": 0.0})


def test_label_inference_hand_cases() -> None:
    w = torch.tensor([[0.1, 0.2], [-0.3, -0.1], [0.2, 0.0]])
    # Bias present: its only negative entry wins even if the weight rows disagree.
    assert infer_label_from_gradient([torch.ones(5), w, torch.tensor([0.3, 0.2, -0.5])], 3) == 2
    # No bias: smallest weight-row sum.
    assert infer_label_from_gradient([torch.ones(5), w], 3) == 1
    with pytest.raises(ValueError, match="last-layer weight"):
        infer_label_from_gradient([torch.ones(5), torch.ones(2, 3)], 3)


@pytest.mark.parametrize("factory", [tiny_net, no_bias_net])
def test_label_inference_recovers_every_class(factory) -> None:
    model = _seeded(factory)
    for y in range(K):
        grad = capture_single_example_gradient(model, _example(y), y)
        assert infer_label_from_gradient(grad, K) == y
