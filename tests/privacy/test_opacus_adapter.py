"""privacy/dpsgd/opacus_adapter.py and what is built on it, against stock Opacus 1.6.

* the copy-free optimizer takes stock ``DPOptimizerFastGradientClipping``'s step draw for draw, also on the
  paths that read Opacus internals (a skipped virtual step, adaptive clipping's adjusted multiplier), and
  keeps Opacus' guard against noising a sum twice;
* the fast grad-sample modules give stock ``GradSampleModule``'s per-sample gradients (full and short
  batches, a layer used twice) and stock ghost clipping's clipped gradient;
* ``make_private`` takes stock ``PrivacyEngine.make_private``'s step under the same seeded noise;
* the adapter's accessors read and write what Opacus reads and writes.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from timm.layers import GroupNormAct
from torch import nn

from privacy.dpsgd import FastGhostClippingModule, FastGradSampleModule, ghost_clipping_backward, make_private
from privacy.dpsgd import opacus_adapter as oa
from privacy.dpsgd.engine import CopyFreeFastGradientClippingOptimizer


def _model(seed: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), GroupNormAct(8, num_groups=2, inplace=False),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))


def _data(n: int = 6):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in m.parameters()])


def _ghost_steps(cls, *, skip_first: bool = False, adjusted: float | None = None, steps: int = 2) -> torch.Tensor:
    from opacus.optimizers import DPOptimizerFastGradientClipping

    x, y = _data()
    m = _model()
    gsm = FastGhostClippingModule(m, batch_first=True, loss_reduction="mean", max_grad_norm=0.5)
    opt = cls(torch.optim.SGD(m.parameters(), lr=0.1), noise_multiplier=1.3, max_grad_norm=0.5,
              expected_batch_size=6, loss_reduction="mean", generator=torch.Generator().manual_seed(11))
    assert isinstance(opt, DPOptimizerFastGradientClipping)
    if adjusted is not None:  # what opacus.utils.adaptive_clipping sets
        opt._adjusted_noise_multiplier = adjusted
    for i in range(steps):
        if skip_first and i == 0:
            opt.signal_skip_step(do_skip=True)  # a virtual step: the clipped sum is kept for the next one
        xi = x.clone().requires_grad_(True)
        ghost_clipping_backward(gsm, nn.functional.cross_entropy(gsm(xi), y, reduction="none"), xi)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return _flat(m)


@pytest.mark.parametrize("path", ["plain", "skipped-virtual-step", "adjusted-noise-multiplier"])
def test_copy_free_optimizer_equals_stock_opacus_step_draw_for_draw(path):
    from opacus.optimizers import DPOptimizerFastGradientClipping

    kwargs = {"plain": {}, "skipped-virtual-step": {"skip_first": True}, "adjusted-noise-multiplier": {"adjusted": 4.0}}
    ours = _ghost_steps(CopyFreeFastGradientClippingOptimizer, **kwargs[path])
    stock = _ghost_steps(DPOptimizerFastGradientClipping, **kwargs[path])
    assert torch.equal(ours, stock)
    assert not torch.equal(stock, _flat(_model()))
    if path != "plain":  # the internal the adapter reads changed the step (the test sees it)
        assert not torch.equal(stock, _ghost_steps(DPOptimizerFastGradientClipping))


@pytest.mark.parametrize("ours", [True, False])
def test_copy_free_optimizer_keeps_opacus_guard_against_noising_twice(ours):
    from opacus.optimizers import DPOptimizerFastGradientClipping

    m = nn.Linear(3, 2)
    cls = CopyFreeFastGradientClippingOptimizer if ours else DPOptimizerFastGradientClipping
    opt = cls(torch.optim.SGD(m.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=2)
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    opt.accumulate()
    opt.add_noise()
    with pytest.raises(ValueError, match="zero_grad"):
        opt.add_noise()


def _per_sample(gsm_cls, model: nn.Module, x: torch.Tensor, y: torch.Tensor, **kw) -> dict[str, torch.Tensor]:
    gsm = gsm_cls(model, batch_first=True, loss_reduction="sum", **kw)
    nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    out = {n: p.grad_sample.clone() for n, p in gsm._module.named_parameters() if p.requires_grad}
    gsm.cleanup()
    return out


class _Twice(nn.Module):
    """One Linear used twice in a forward: per-sample gradients accumulate over both uses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.lin(torch.tanh(self.lin(x))))


@pytest.mark.parametrize("case", ["cnn", "cnn-functorch", "linear-used-twice"])
def test_fast_grad_sample_module_gives_stock_opacus_per_sample_gradients(case):
    from opacus.grad_sample import GradSampleModule

    if case == "linear-used-twice":
        model, (x, y) = _Twice(), (torch.randn(5, 4, generator=torch.Generator().manual_seed(1)),
                                   torch.tensor([0, 1, 2, 0, 1]))
    else:
        model, (x, y) = _model(), _data()
    kw = {"force_functorch": True} if case == "cnn-functorch" else {}
    ours = _per_sample(FastGradSampleModule, copy.deepcopy(model), x, y, **kw)
    stock = _per_sample(GradSampleModule, copy.deepcopy(model), x, y, **kw)
    assert ours.keys() == stock.keys() and ours
    for name in ours:
        torch.testing.assert_close(ours[name], stock[name], rtol=1e-4, atol=1e-6, msg=name)


def test_fast_ghost_clipping_gives_stock_opacus_clipped_gradient():
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    x, y = _data()
    grads = {}
    for name in ("ours", "stock"):
        m = _model()
        if name == "ours":
            gsm = FastGhostClippingModule(m, batch_first=True, loss_reduction="mean", max_grad_norm=0.05)
            xi = x.clone().requires_grad_(True)
            ghost_clipping_backward(gsm, nn.functional.cross_entropy(gsm(xi), y, reduction="none"), xi)
        else:
            gsm = GradSampleModuleFastGradientClipping(m, batch_first=True, loss_reduction="mean", max_grad_norm=0.05)
            opt = DPOptimizerFastGradientClipping(torch.optim.SGD(m.parameters(), lr=0.1), noise_multiplier=0.0,
                                                  max_grad_norm=0.05, expected_batch_size=6)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                DPLossFastGradientClipping(gsm, opt, nn.CrossEntropyLoss(), loss_reduction="mean")(gsm(x), y).backward()
        grads[name] = torch.cat([p.grad.flatten() for p in m.parameters()])
    torch.testing.assert_close(grads["ours"], grads["stock"], rtol=1e-4, atol=1e-7)
    assert grads["stock"].abs().sum() > 0


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_make_private_takes_stock_privacy_engine_step_under_the_same_seeded_noise(mode):
    """Fixed batch, sigma > 0: the noise generator of our make_private, cloned into stock
    ``PrivacyEngine.make_private(noise_generator=...)``, gives the same parameters after one step."""
    import opacus

    x, y = _data()
    m = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt = make_private(m, torch.optim.SGD(m.parameters(), lr=0.5), 6, 6, noise_multiplier=0.8,
                          max_grad_norm=0.05, grad_sample_mode=mode, poisson_sampling=False)
    g = torch.Generator().set_state(pt.optimizer.generator.get_state())
    if mode == "ghost":
        xi = x.clone().requires_grad_(True)
        ghost_clipping_backward(pt.model, nn.functional.cross_entropy(pt.model(xi), y, reduction="none"), xi)
    else:
        pt.criterion(pt.model(x), y).backward()
    pt.optimizer.step()

    s = _model()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = opacus.PrivacyEngine().make_private(
            module=s, optimizer=torch.optim.SGD(s.parameters(), lr=0.5), data_loader=loader,
            criterion=nn.CrossEntropyLoss(), noise_multiplier=0.8, max_grad_norm=0.05, grad_sample_mode=mode,
            poisson_sampling=False, noise_generator=g)
    wrapped, opt = out[0], out[1]
    crit = out[2] if mode == "ghost" else nn.CrossEntropyLoss()
    crit(wrapped(x), y).backward()
    opt.step()
    torch.testing.assert_close(_flat(m), _flat(s), rtol=1e-4, atol=1e-6)
    assert (_flat(m) - _flat(_model())).abs().max() > 1e-3  # the noise moved the parameters


def test_the_accessors_read_and_write_opacus_own_slots():
    from opacus.grad_sample import GradSampleModule, create_or_accumulate_grad_sample

    gsm = GradSampleModule(nn.Linear(3, 2))
    assert oa.wrapped_module(gsm) is gsm._module and oa.wrapped_module(gsm._module) is gsm._module
    p = nn.Parameter(torch.zeros(2, 3))
    p._forward_counter = 2
    assert oa.parameter_backward_done(p) is False and oa.parameter_backward_done(p) is True
    oa.record_norm_sample(p, torch.ones(4))
    assert torch.equal(p._norm_sample, torch.ones(4)) and p._forward_counter == -1
    q, r = nn.Parameter(torch.zeros(2, 3)), nn.Parameter(torch.zeros(2, 3))
    gs = torch.randn(3, 2, 3)
    oa.store_grad_sample(param=q, grad_sample=gs, max_batch_len=4)
    create_or_accumulate_grad_sample(param=r, grad_sample=gs, max_batch_len=4)
    assert torch.equal(q._current_grad_sample, r._current_grad_sample)
    opt = CopyFreeFastGradientClippingOptimizer(torch.optim.SGD([p], lr=0.1), noise_multiplier=1.5,
                                                max_grad_norm=1.0, expected_batch_size=2)
    assert not oa.step_skip_pending(opt)
    opt.signal_skip_step(do_skip=True)
    assert oa.step_skip_pending(opt)
    assert oa.effective_noise_multiplier(opt) == 1.5
    opt._adjusted_noise_multiplier = 2.5
    assert oa.effective_noise_multiplier(opt) == 2.5
