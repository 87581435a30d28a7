"""DP-SGD wiring (Opacus): plain-step equivalence, per-sample clipping, noise scale, model fixing, FedProx term."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import timm
import torch
from scipy import stats
from timm.layers import BatchNormAct2d, GroupNormAct
from torch import nn

from flower_apps.ultrasound.train import DpSettings, lr_at_round, proximal_term, train_local
from privacy.dpsgd import make_opacus_compatible, make_private, unwrap
from privacy.randomness import NoiseSource

torch.set_num_threads(1)
# Opacus hooks the first layer, whose input needs no gradient: PyTorch's notice about it is expected.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 3))


def data(n: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def dp_step(model, x, y, c: float, z: float, lr: float = 0.5, loss_scale: float = 1.0, seed: int = 0,
            noise: NoiseSource | None = None):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt = make_private(model, opt, len(y), len(y), noise_multiplier=z, max_grad_norm=c, poisson_sampling=False,
                          seed=seed, noise=noise)
    (idx,) = next(iter(pt.loader))
    pt.optimizer.zero_grad()
    (loss_scale * pt.criterion(pt.model(x[idx]), y[idx])).backward()
    pt.optimizer.step()
    return unwrap(pt.model)


def test_huge_clip_and_zero_noise_equal_the_plain_step():
    x, y = data()
    plain = tiny_model()
    opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    nn.functional.cross_entropy(plain(x), y).backward()
    opt.step()
    m = tiny_model()
    with pytest.warns(UserWarning, match="epsilon is infinite"):
        make_private(m, torch.optim.SGD(m.parameters(), lr=0.1), 6, 6, noise_multiplier=0.0, max_grad_norm=1.0)
    private = dp_step(tiny_model(), x, y, c=1e6, z=0.0)
    for a, b in zip(plain.parameters(), private.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_small_clip_norm_clips_each_per_sample_gradient():
    x, y = data()
    c, lr = 0.05, 0.5
    ref = tiny_model()
    # independent per-sample gradients: one backward per sample (micro-batches of one)
    clipped_sum = [torch.zeros_like(p) for p in ref.parameters()]
    norms = []
    for i in range(len(y)):
        ref.zero_grad()
        nn.functional.cross_entropy(ref(x[i : i + 1]), y[i : i + 1]).backward()
        grads = [p.grad.clone() for p in ref.parameters()]
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        norms.append(float(norm))
        for s, g in zip(clipped_sum, grads):
            s += g * min(1.0, c / (float(norm) + 1e-6))
    assert min(norms) > c  # every sample is clipped: the check is not vacuous
    expected = [p.detach() - lr * s / len(y) for p, s in zip(ref.parameters(), clipped_sum)]
    private = dp_step(tiny_model(), x, y, c=c, z=0.0, lr=lr)
    for e, p in zip(expected, private.parameters()):
        torch.testing.assert_close(p.detach(), e, rtol=1e-4, atol=1e-6)


def test_noise_sd_is_z_times_c_over_batch(tmp_path):
    """Zero data gradient: the update is pure noise N(0, (z C / B)^2) per coordinate (chi-square test)."""
    (tmp_path / "seed").write_text("client-secret")
    seeded = NoiseSource(str(tmp_path / "seed"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 64))
    before = [p.detach().clone() for p in model.parameters()]
    x, y64 = torch.randn(8, 3, 8, 8), torch.randint(0, 64, (8,))
    z, c, lr = 1.3, 0.7, 1.0
    after = dp_step(model, x, y64, c=c, z=z, lr=lr, loss_scale=0.0, seed=11, noise=seeded)
    noise = torch.cat([(b - a.detach()).flatten() for a, b in zip(after.parameters(), before)]).numpy()
    sigma = z * c / 8
    n = noise.size
    stat = (n - 1) * noise.var(ddof=1) / sigma**2
    assert stats.chi2.ppf(0.0005, n - 1) < stat < stats.chi2.ppf(0.9995, n - 1)
    assert abs(noise.mean()) < 4 * sigma / np.sqrt(n)
    # a 20% wrong scale is detected at this sample size
    assert not (stats.chi2.ppf(0.0005, n - 1) < stat / 1.2**2 < stats.chi2.ppf(0.9995, n - 1))
    torch.manual_seed(0)
    twin = nn.Sequential(nn.Flatten(), nn.Linear(192, 64))
    twin_after = dp_step(twin, x, y64, c=c, z=z, lr=lr, loss_scale=0.0, seed=11, noise=seeded)
    torch.testing.assert_close(next(twin_after.parameters()), next(after.parameters()))  # same file+seed, same noise
    torch.manual_seed(0)
    other = dp_step(nn.Sequential(nn.Flatten(), nn.Linear(192, 64)), x, y64, c=c, z=z, lr=lr, loss_scale=0.0, seed=12,
                    noise=seeded)
    assert not torch.equal(next(other.parameters()), next(after.parameters()))  # another seed, other noise


def test_server_cannot_reproduce_client_dpsgd_noise_from_the_seed_it_chose():
    """Secure mode (default): the same model, data and (server-chosen) seed give different noise each time,
    and none of the generators the server could seed from that seed reproduces it."""
    x, y64 = torch.randn(8, 3, 8, 8), torch.randint(0, 64, (8,))
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        before = [p.detach().clone() for p in nn.Sequential(nn.Flatten(), nn.Linear(192, 64)).parameters()]
        torch.manual_seed(0)
        after = dp_step(nn.Sequential(nn.Flatten(), nn.Linear(192, 64)), x, y64, c=0.7, z=1.3, lr=1.0,
                        loss_scale=0.0, seed=11)
        runs.append((before[0] - next(after.parameters()).detach()).flatten())
    assert not torch.equal(runs[0], runs[1])
    sigma = 1.3 * 0.7 / 8
    for guess in (11, 12, 10, 0):  # the old derivation used seed + 1; try the seed's neighbours too
        g = torch.Generator().manual_seed(guess)
        z = torch.normal(0.0, sigma, size=(64, 192), generator=g).flatten()
        assert not torch.allclose(z, runs[0], atol=1e-6) and not torch.allclose(-z, runs[0], atol=1e-6)


def test_fedprox_term_hand_computation():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    v = torch.tensor([[3.0]], requires_grad=True)
    anchor = [torch.tensor([0.0, 1.0]), torch.tensor([[1.0]])]
    term = proximal_term([w, v], anchor)
    assert float(term.detach()) == pytest.approx(1 + 1 + 4)  # (1-0)^2 + (2-1)^2 + (3-1)^2
    mu = 0.3
    (mu / 2 * term).backward()
    torch.testing.assert_close(w.grad, torch.tensor([0.3, 0.3]))  # mu (w - w_t)
    torch.testing.assert_close(v.grad, torch.tensor([[0.6]]))


def _u8(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 8, 8), generator=g, dtype=torch.uint8), torch.randint(0, 3, (n,), generator=g)


def test_dp_fedprox_equals_plain_fedprox_without_noise_or_clipping():
    """The proximal gradient is added after privatization; with C huge and z = 0 both paths agree."""
    x, y = _u8()
    kw = dict(epochs=3, batch_size=16, lr_for_epoch=lambda e: 0.05, device=torch.device("cpu"), seed=0,
              proximal_mu=5.0)
    plain, private = tiny_model(), tiny_model()
    train_local(plain, x, y, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats_ = train_local(private, x, y, dp=DpSettings(0.0, 1e6, poisson_sampling=False), **kw)
    assert stats_.steps == 3 and stats_.sample_rate == 1.0
    for a, b in zip(plain.parameters(), private.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # and mu matters: without the term the weights end elsewhere
    free = tiny_model()
    train_local(free, x, y, **{**kw, "proximal_mu": 0.0})
    assert any(not torch.allclose(a, b) for a, b in zip(free.parameters(), plain.parameters()))


def test_fedprox_pulls_towards_the_global_model():
    x, y = _u8(12)
    start = tiny_model()
    dist = {}
    for mu in (0.0, 50.0):
        m = copy.deepcopy(start)
        train_local(m, x, y, epochs=4, batch_size=4, lr_for_epoch=lambda e: 0.05, device=torch.device("cpu"),
                    seed=1, proximal_mu=mu)
        dist[mu] = float(proximal_term(list(m.parameters()), [p.detach() for p in start.parameters()]).detach())
    assert dist[50.0] < 0.5 * dist[0.0]


def test_lr_schedule_decays_at_50_and_80_percent():
    assert [lr_at_round(1e-3, r, 100) for r in (1, 50, 51, 80, 81, 100)] == pytest.approx(
        [1e-3, 1e-3, 1e-4, 1e-4, 1e-5, 1e-5])


def test_batchnormact_is_replaced_deliberately_and_opacus_accepts_the_model():
    from opacus import PrivacyEngine
    from opacus.validators import ModuleValidator

    model = timm.create_model("mobilenetv2_100", num_classes=2)
    n_bnact = sum(isinstance(m, BatchNormAct2d) for m in model.modules())
    acts = [type(m.act) for m in model.modules() if isinstance(m, BatchNormAct2d)]
    # the trap: Opacus' own fixer leaves timm's fused BatchNormAct2d in place
    naive = ModuleValidator.fix(copy.deepcopy(model))
    assert any(isinstance(m, BatchNormAct2d) for m in naive.modules())
    fixed, changes = make_opacus_compatible(model)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in fixed.modules())
    gn = [m for m in fixed.modules() if isinstance(m, GroupNormAct)]
    assert len(gn) == n_bnact and [type(m.act) for m in gn] == acts  # activation carried over
    assert sum("BatchNormAct2d" in c.old for c in changes) == n_bnact
    assert ModuleValidator.validate(fixed, strict=False) == []
    x = torch.randn(4, 3, 32, 32)
    y = torch.tensor([0, 1, 0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt = make_private(fixed, torch.optim.Adam(fixed.parameters()), 4, 4, noise_multiplier=1.0, max_grad_norm=1.0)
        pt.criterion(pt.model(x), y).backward()
        pt.optimizer.step()
        with pytest.raises(NotImplementedError):  # what make_private does with the naive fix
            PrivacyEngine().make_private(module=naive, optimizer=torch.optim.SGD(naive.parameters(), lr=0.1),
                                         data_loader=torch.utils.data.DataLoader(
                                             torch.utils.data.TensorDataset(x, y), batch_size=2),
                                         noise_multiplier=1.0, max_grad_norm=1.0)


def test_resnet_inplace_residual_is_made_out_of_place():
    model = timm.create_model("resnet18", num_classes=2)
    fixed, changes = make_opacus_compatible(model)
    assert any("in-place residual" in c.old for c in changes)
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt = make_private(fixed, torch.optim.SGD(fixed.parameters(), lr=0.1), 3, 3, noise_multiplier=0.5,
                          max_grad_norm=1.0, poisson_sampling=False)
        pt.criterion(pt.model(x), y).backward()  # raised "a view ... modified inplace" before the fix
        pt.optimizer.step()
    assert all(p.grad is not None for p in fixed.parameters() if p.requires_grad)


@pytest.mark.parametrize("act", ["relu6", "relu", "silu", "none"])
def test_fast_grad_samplers_match_micro_batch_gradients(act):
    """privacy.dpsgd's depthwise / grouped / pointwise conv and GroupNormAct samplers vs one backward per sample."""
    from privacy.dpsgd import FastGradSampleModule, samplers

    assert FastGradSampleModule.GRAD_SAMPLERS[nn.Conv2d] is samplers.conv2d_grad_sample  # for this class only
    assert FastGradSampleModule.GRAD_SAMPLERS[GroupNormAct] is samplers.group_norm_act_grad_sample
    acts = {"relu6": nn.ReLU6, "relu": nn.ReLU, "silu": nn.SiLU, "none": None}
    norm = lambda c, g: GroupNormAct(c, num_groups=g, act_layer=acts[act], apply_act=acts[act] is not None,
                                     inplace=False)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, stride=2, padding=1),  # dense 3x3: Opacus' own sampler
        norm(6, 3),
        nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False),  # depthwise
        norm(6, 2),
        nn.Conv2d(6, 12, 3, stride=2, padding=1, groups=3),  # grouped, strided
        nn.Conv2d(12, 4, 1),  # pointwise
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    with torch.no_grad():  # non-trivial affine weights so that the activation's mask matters
        for m in model.modules():
            if isinstance(m, GroupNormAct):
                m.weight.uniform_(0.5, 2.0)
                m.bias.uniform_(-0.5, 0.5)
    x, y = torch.randn(5, 3, 12, 12), torch.randint(0, 3, (5,))
    ref = []
    for i in range(5):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        ref.append([p.grad.clone() for p in model.parameters()])
    gsm = FastGradSampleModule(copy.deepcopy(model), loss_reduction="sum")
    nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    for j, p in enumerate(gsm._module.parameters()):
        expected = torch.stack([r[j] for r in ref])
        torch.testing.assert_close(p.grad_sample, expected, rtol=1e-4, atol=1e-5)


def _clipped_steps(model, modes) -> dict:
    """Each grad-sample mode's weights after two clipped, noise-free full-batch steps from ``model()``."""
    x, y = _u8(6)
    out = {}
    for mode in modes:
        m = model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train_local(m, x, y, epochs=2, batch_size=6, lr_for_epoch=lambda e: 0.05, device=torch.device("cpu"),
                        seed=0, dp=DpSettings(0.0, 0.01, mode, poisson_sampling=False))
        out[mode] = torch.cat([p.detach().flatten() for p in m.parameters()])
    return out


def test_every_grad_sample_mode_gives_the_same_clipped_step():
    """Materialized per-sample gradients (hooks, functorch) and ghost clipping (norms only, two passes) agree
    with clipping active and no noise; the model has depthwise, pointwise (Gram-norm) and GroupNormAct layers."""
    def model():
        torch.manual_seed(3)
        return nn.Sequential(nn.Conv2d(3, 16, 3, stride=4, padding=1),  # 8x8 -> 2x2
                             GroupNormAct(16, num_groups=4, inplace=False),
                             nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Conv2d(16, 16, 1),  # L = 4: Gram norm
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3))

    out = _clipped_steps(model, ("hooks", "functorch", "ghost"))
    start = torch.cat([p.detach().flatten() for p in model().parameters()])
    assert not torch.allclose(out["hooks"], start)
    torch.testing.assert_close(out["ghost"], out["hooks"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out["functorch"], out["hooks"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_fast_samplers_are_per_model_and_stock_opacus_gives_the_same_step(mode):
    """In one process: a model made private with fast_samplers=False gets Opacus' own class and samplers, one
    made private with the default gets ours, and both take the same clipped step."""
    from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping
    from opacus.grad_sample.conv import compute_conv_grad_sample

    from privacy.dpsgd import FastGhostClippingModule, FastGradSampleModule, ghost_clipping_backward

    def model():
        torch.manual_seed(3)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), GroupNormAct(8, num_groups=2, inplace=False),
                             nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, 1),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))

    x, y = data()
    stock_cls, fast_cls = {"hooks": (GradSampleModule, FastGradSampleModule),
                           "ghost": (GradSampleModuleFastGradientClipping, FastGhostClippingModule)}[mode]
    after = {}
    for fast in (True, False):
        m = model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pt = make_private(m, torch.optim.SGD(m.parameters(), lr=0.5), 6, 6, noise_multiplier=0.0,
                              max_grad_norm=0.05, grad_sample_mode=mode, poisson_sampling=False, fast_samplers=fast)
            assert type(pt.model) is (fast_cls if fast else stock_cls)
            if mode == "ghost":
                xi = x.detach().requires_grad_(True)
                ghost_clipping_backward(pt.model, nn.functional.cross_entropy(pt.model(xi), y, reduction="none"), xi)
            else:
                pt.criterion(pt.model(x), y).backward()
            pt.optimizer.step()
        after[fast] = torch.cat([p.detach().flatten() for p in m.parameters()])
    assert GradSampleModule.GRAD_SAMPLERS[nn.Conv2d] is compute_conv_grad_sample  # the stock registry is untouched
    assert GroupNormAct not in GradSampleModule.GRAD_SAMPLERS
    assert GroupNormAct not in GradSampleModuleFastGradientClipping.NORM_SAMPLERS
    assert not torch.allclose(after[True], torch.cat([p.detach().flatten() for p in model().parameters()]))
    torch.testing.assert_close(after[True], after[False], rtol=1e-4, atol=1e-6)


def test_vit_tokens_move_to_a_leaf_and_per_sample_gradients_match():
    from privacy.dpsgd import FastGradSampleModule

    torch.manual_seed(0)
    vit = timm.create_model("vit_small_patch16_224", img_size=32, depth=1, num_classes=3)
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([0, 2, 1])
    with torch.no_grad():
        before = vit.eval()(x)
    fixed, changes = make_opacus_compatible(copy.deepcopy(vit))
    assert any("token_embed" in c.new for c in changes)
    assert not any(n in ("cls_token", "pos_embed") for n, _ in fixed.named_parameters(recurse=False))
    with torch.no_grad():
        torch.testing.assert_close(fixed.eval()(x), before)  # same function, values kept
    fixed.train()
    ref = []
    for i in range(3):
        fixed.zero_grad()
        nn.functional.cross_entropy(fixed(x[i : i + 1]), y[i : i + 1]).backward()
        ref.append({n: p.grad.clone() for n, p in fixed.named_parameters()})
    gsm = FastGradSampleModule(copy.deepcopy(fixed), loss_reduction="sum")
    assert "ft_compute_sample_grad" not in vars(gsm._module.token_embed)  # our sampler, not functorch
    nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    for n, p in gsm._module.named_parameters():
        torch.testing.assert_close(p.grad_sample, torch.stack([r[n] for r in ref]), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("dp", [None, "hooks", "ghost"])
def test_channels_last_training_takes_the_same_steps(dp, tmp_path):
    """us-channels-last changes the memory layout only: the same seed gives the same weights up to the
    summation order, and the model comes back in the default layout (its state travels as arrays).
    DP-SGD ignores it (bit-identical runs; a seed file gives both the same batches and noise): Opacus'
    per-sample conv gradients are wrong for channels-last inputs, which this test catches (weights off
    by up to 0.1) if the layout is ever applied under DP."""
    def model():
        torch.manual_seed(5)
        # no conv bias before BatchNorm (as in real backbones) and no dead ReLUs: a gradient that is zero
        # up to rounding would let Adam turn the layouts' rounding differences into full-size steps
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=dp is not None),
                             nn.BatchNorm2d(8) if dp is None else nn.Identity(),
                             nn.Tanh(), nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, 1),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))

    secret = tmp_path / "noise-seed"
    secret.write_text("a local secret")
    x, y = _u8(12)
    out = {}
    for cl in (False, True):
        m = model()
        settings = None if dp is None else DpSettings(1.0, 0.5, dp, noise=NoiseSource(str(secret)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train_local(m, x, y, epochs=2, batch_size=4, lr_for_epoch=lambda e: 0.05, device=torch.device("cpu"),
                        seed=0, channels_last=cl, dp=settings)
        assert all(p.is_contiguous() for p in m.parameters())
        out[cl] = torch.cat([p.detach().flatten() for p in m.parameters()])
    start = torch.cat([p.detach().flatten() for p in model().parameters()])
    assert not torch.allclose(out[False], start)
    if dp is None:
        torch.testing.assert_close(out[True], out[False], rtol=1e-4, atol=1e-5)
    else:
        assert torch.equal(out[True], out[False])


def test_ghost_clipping_after_a_frozen_prefix_stops_at_the_first_trainable_layer():
    """Head-only and last-layers DP (frozen-bn-head / -last): ghost clipping differentiates the trainable
    parameters instead of the batch, so the frozen backbone is run forward only, and takes the same clipped
    step as materialized per-sample gradients (hooks)."""
    from privacy.dpsgd import ghost_targets

    def model():
        torch.manual_seed(3)
        m = nn.Sequential(nn.Conv2d(3, 16, 3, stride=4, padding=1), GroupNormAct(16, num_groups=4, inplace=False),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Conv2d(16, 16, 1),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3))
        for p in m[:3].parameters():  # a frozen prefix: the stem, its norm and the depthwise conv
            p.requires_grad_(False)
        return m

    out = _clipped_steps(model, ("hooks", "ghost"))
    start = torch.cat([p.detach().flatten() for p in model().parameters()])
    frozen = sum(p.numel() for p in model()[:3].parameters())
    assert torch.equal(out["ghost"][:frozen], start[:frozen]) and not torch.allclose(out["ghost"], start)
    torch.testing.assert_close(out["ghost"], out["hooks"], rtol=1e-4, atol=1e-6)
    # the targets: the trainable parameters after a frozen prefix, the batch when the first layer trains
    m, xb = model(), torch.zeros(2, 3, 8, 8)
    assert ghost_targets(m, xb) == [p for p in m.parameters() if p.requires_grad] and not xb.requires_grad
    m[0].weight.requires_grad_(True)
    assert ghost_targets(m, xb) == [xb] and xb.requires_grad
