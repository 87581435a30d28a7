"""Book-keeping ghost clipping and the copy-free DP optimizer against independent computations.

Every book sampler's norms and clipped sums are checked against per-sample micro-batch gradients
(one backward per sample), the one-pass step against the two-pass step and against clipping done by
hand, and the optimizer's noise against Opacus' own optimizer draw for draw.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import timm
import torch
from timm.layers import GroupNormAct
from torch import nn

from privacy.dpsgd import FastGhostClippingModule, ghost_clipping_backward, make_private
from privacy.dpsgd.book_keeping import BOOK_SAMPLERS, from_grad_sampler, linear_norm_sample
from privacy.dpsgd.compat import PrefixTokenPosEmbed
from privacy.dpsgd.samplers import FAST_GRAD_SAMPLERS


def _micro_batch_grads(layer: nn.Module, x: torch.Tensor, r: torch.Tensor) -> list[list[torch.Tensor]]:
    """grad of L_i = <layer(x_i), r_i> w.r.t. the layer's parameters, one backward per sample."""
    out = []
    for i in range(len(x)):
        layer.zero_grad()
        (layer(x[i : i + 1]) * r[i : i + 1]).sum().backward()
        out.append([p.grad.clone() for p in layer.parameters()])
    return out


def _book_sample(layer: nn.Module, x: torch.Tensor, r: torch.Tensor):
    """Run the layer's book sampler on the activations and output gradients of L = sum_i <layer(x_i), r_i>."""
    y = layer(x)
    # layers without a book sampler: their per-sample gradients, contracted (the hook's other route)
    book_sampler = BOOK_SAMPLERS.get(type(layer)) or from_grad_sampler(FAST_GRAD_SAMPLERS[type(layer)])
    return book_sampler(layer, [x.detach()], r.expand_as(y).contiguous())


LAYERS = {
    "linear 2d": (lambda: nn.Linear(7, 5), (6, 7)),
    "linear tokens, Gram form": (lambda: nn.Linear(24, 20), (6, 3, 24)),  # T (d_in + d_out) < d_in d_out
    "linear tokens, direct": (lambda: nn.Linear(4, 3), (6, 9, 4)),  # per-sample gradients formed
    "linear 4d, no bias": (lambda: nn.Linear(5, 4, bias=False), (6, 2, 3, 5)),
    "conv dense, Gram form": (lambda: nn.Conv2d(16, 24, 3, padding=1), (6, 16, 2, 2)),
    "conv dense, gradients kept": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), (6, 3, 9, 9)),
    "conv dense, weight-gradient conv": (lambda: nn.Conv2d(8, 8, 3, padding=1), (6, 8, 3, 3)),
    "conv depthwise": (lambda: nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False), (6, 6, 8, 8)),
    "conv grouped, strided, dilated": (lambda: nn.Conv2d(6, 9, 3, stride=2, padding=2, dilation=2, groups=3),
                                       (6, 6, 9, 9)),
    "conv pointwise": (lambda: nn.Conv2d(5, 7, 1), (6, 5, 4, 4)),
    "conv reflect padding": (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (6, 3, 5, 5)),
    "GroupNormAct relu6": (lambda: GroupNormAct(6, num_groups=3, act_layer=nn.ReLU6, inplace=False), (6, 6, 4, 4)),
    "GroupNormAct relu": (lambda: GroupNormAct(6, num_groups=2, act_layer=nn.ReLU, inplace=False), (6, 6, 3, 3)),
    "timm LayerNorm": (lambda: timm.layers.LayerNorm(8), (6, 5, 8)),
    "token leaf": (lambda: PrefixTokenPosEmbed(nn.Parameter(torch.randn(1, 1, 8)), nn.Parameter(torch.randn(1, 5, 8))),
                   (6, 4, 8)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_book_sampler_norms_and_clipped_sums_match_micro_batch_gradients(name):
    make, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = make()
    if isinstance(layer, (GroupNormAct, nn.LayerNorm)):  # non-trivial affine weights (the activation's mask)
        with torch.no_grad():
            layer.weight.uniform_(0.5, 2.0)
            layer.bias.uniform_(-0.5, 0.5)
    x = torch.randn(*shape)
    with torch.no_grad():
        r = torch.randn_like(layer(x))
    ref = _micro_batch_grads(layer, x, r)
    norms, clipped_sum = _book_sample(layer, x, r)
    coef = torch.rand(len(x))
    sums = clipped_sum(coef)
    assert set(norms) == set(sums) == {p for p in layer.parameters()}
    for j, p in enumerate(layer.parameters()):
        per_sample = torch.stack([g[j] for g in ref])
        torch.testing.assert_close(norms[p], per_sample.flatten(1).norm(dim=1), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sums[p].view_as(p), torch.einsum("n,n...->...", coef, per_sample),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 3, 6), (4, 9, 6), (4, 6)])
def test_linear_norm_sample_hand_computed(shape):
    """Both branches (Gram form, formed gradient) and the 2-d case equal ||a_i^T g_i||_F, ||sum_t g_t||."""
    torch.manual_seed(1)
    layer = nn.Linear(6, 5)
    a = torch.randn(*shape)
    g = torch.randn(*shape[:-1], 5)
    out = linear_norm_sample(layer, [a], g)
    a3, g3 = a.reshape(4, -1, 6), g.reshape(4, -1, 5)
    expected_w = torch.stack([(g3[i].T @ a3[i]).norm() for i in range(4)])
    torch.testing.assert_close(out[layer.weight], expected_w)
    torch.testing.assert_close(out[layer.bias], g3.sum(1).norm(dim=1))


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=4, padding=1),  # 8x8 -> 2x2
                         GroupNormAct(16, num_groups=4, inplace=False),
                         nn.Conv2d(16, 16, 3, padding=1, groups=16),  # depthwise
                         nn.Conv2d(16, 16, 1),  # L = 4: Gram norm
                         nn.GroupNorm(4, 16),  # Opacus' per-sample gradients, contracted
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(16), nn.Linear(16, 3))


def _clipped_sum_by_hand(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float) -> torch.Tensor:
    grads = []
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    g = torch.stack(grads)
    coef = (clip / (g.norm(dim=1) + 1e-6)).clamp(max=1.0)
    return (coef[:, None] * g).sum(0)


@pytest.mark.parametrize("arch", ["convnet", "vit"])
def test_one_pass_and_two_pass_ghost_clipping_give_the_hand_clipped_sum(arch):
    if arch == "vit":
        from privacy.dpsgd import make_opacus_compatible

        torch.manual_seed(0)
        model, _ = make_opacus_compatible(timm.create_model("vit_small_patch16_224", img_size=32, depth=1,
                                                            num_classes=3))
        x = torch.randn(5, 3, 32, 32)
    else:
        model = _model()
        x = torch.randn(5, 3, 8, 8)
    model.train()
    y = torch.tensor([0, 2, 1, 1, 0])
    clip = 0.05  # every sample is clipped
    expected = _clipped_sum_by_hand(copy.deepcopy(model), x, y, clip)
    got = {}
    for book_keeping in (True, False):
        m = copy.deepcopy(model)
        gsm = FastGhostClippingModule(m, batch_first=True, loss_reduction="mean", max_grad_norm=clip)
        assert gsm.book_keeping_supported()
        xi = x.clone().requires_grad_(True)
        ghost_clipping_backward(gsm, nn.functional.cross_entropy(gsm(xi), y, reduction="none"), xi,
                                book_keeping=book_keeping)
        assert gsm._book is None
        got[book_keeping] = torch.cat([p.grad.flatten() for p in m.parameters()])
    assert float(gsm.per_sample_gradient_norms.min()) > clip
    torch.testing.assert_close(got[True], expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[False], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # integer inputs: expected
def test_a_layer_with_only_a_norm_sampler_falls_back_to_two_passes():
    """Opacus' Embedding has a norm sampler and no book sampler: the step takes the second pass, still exact."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 3))
    x, y = torch.randint(0, 10, (5, 3)), torch.tensor([0, 2, 1, 1, 0])
    expected = _clipped_sum_by_hand(copy.deepcopy(model), x, y, 0.05)
    gsm = FastGhostClippingModule(model, batch_first=True, loss_reduction="mean", max_grad_norm=0.05)
    assert not gsm.book_keeping_supported()
    with pytest.raises(ValueError, match="book sampler"):
        gsm.start_book_keeping()
    emb = gsm(x)  # integer inputs: differentiate w.r.t. a leaf the first pass can reach
    h = gsm._module[0].weight
    ghost_clipping_backward(gsm, nn.functional.cross_entropy(emb, y, reduction="none"), h)
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in model.parameters()]), expected,
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("noise_multiplier", [0.0, 1.3])
def test_copy_free_optimizer_takes_opacus_step_draw_for_draw(noise_multiplier):
    """Same gradients, same noise generator seed: the copy-free optimizer and Opacus' ghost-clipping optimizer
    leave bit-identical parameters after two steps (noise included)."""
    from opacus.optimizers import DPOptimizerFastGradientClipping

    from privacy.dpsgd.engine import CopyFreeFastGradientClippingOptimizer

    x, y = torch.randn(6, 3, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    after = {}
    for cls in (CopyFreeFastGradientClippingOptimizer, DPOptimizerFastGradientClipping):
        m = _model()
        gsm = FastGhostClippingModule(m, batch_first=True, loss_reduction="mean", max_grad_norm=0.5)
        opt = cls(torch.optim.Adam(m.parameters(), lr=0.01), noise_multiplier=noise_multiplier, max_grad_norm=0.5,
                  expected_batch_size=6, loss_reduction="mean", generator=torch.Generator().manual_seed(7))
        for _ in range(2):
            xi = x.clone().requires_grad_(True)
            ghost_clipping_backward(gsm, nn.functional.cross_entropy(gsm(xi), y, reduction="none"), xi)
            opt.step()
            opt.zero_grad(set_to_none=True)
        after[cls] = torch.cat([p.detach().flatten() for p in m.parameters()])
    assert torch.equal(after[CopyFreeFastGradientClippingOptimizer], after[DPOptimizerFastGradientClipping])
    start = torch.cat([p.detach().flatten() for p in _model().parameters()])
    assert not torch.equal(after[DPOptimizerFastGradientClipping], start)


def test_make_private_uses_the_copy_free_optimizer_only_with_fast_samplers():
    from opacus.optimizers import DPOptimizerFastGradientClipping

    from privacy.dpsgd.engine import CopyFreeFastGradientClippingOptimizer

    for fast in (True, False):
        m = _model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pt = make_private(m, torch.optim.SGD(m.parameters(), lr=0.1), 6, 6, noise_multiplier=1.0,
                              max_grad_norm=1.0, grad_sample_mode="ghost", poisson_sampling=False, fast_samplers=fast)
        expected = CopyFreeFastGradientClippingOptimizer if fast else DPOptimizerFastGradientClipping
        assert type(pt.optimizer) is expected
