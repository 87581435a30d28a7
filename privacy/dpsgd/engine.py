"""Client-side DP-SGD wiring: Opacus' ``PrivacyEngine.make_private`` over a loader of indices, two-pass ghost clipping.

:func:`make_private` assembles what ``PrivacyEngine.make_private`` assembles, from the same public
Opacus parts (``DPDataLoader``, ``get_optimizer_class``, ``DPLossFastGradientClipping``), so that the
model can be wrapped by :func:`privacy.dpsgd.grad_sample.grad_sample_module`: the engine only
accepts a pre-wrapped model of Opacus' exact class. That is how the fast samplers reach this model
and no other. The engine's accountant is left out on purpose: epsilon comes from
:class:`privacy.dpsgd.ledger.DpSgdLedger`, which the caller fills.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from privacy.dpsgd.grad_sample import grad_sample_module
from privacy.randomness import STREAM_DPSGD, NoiseSource

GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew", "ghost")


@dataclass
class PrivateTraining:
    """What :func:`make_private` returns: the wrapped model, DP optimizer, loader of index batches, criterion."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: torch.utils.data.DataLoader
    criterion: nn.Module
    sample_rate: float


def make_private(model: nn.Module, optimizer: torch.optim.Optimizer, num_samples: int, batch_size: int, *,
                 noise_multiplier: float, max_grad_norm: float, grad_sample_mode: str = "hooks",
                 seed: int = 0, poisson_sampling: bool = True, noise: NoiseSource | None = None,
                 fast_samplers: bool = True) -> PrivateTraining:
    """Opacus' ``PrivacyEngine.make_private`` over a loader of *indices* 0..n-1.

    The loader yields index batches (Poisson-sampled with rate q = batch_size / n when
    ``poisson_sampling``), so the caller fetches and augments the images itself.

    Threat model: the noise (and, for amplification by subsampling, the batch sampling) hides a
    client's examples from the server and everyone downstream, so both come from ``noise``, the
    client's own secret source (privacy.randomness: OS entropy by default), never from ``seed``,
    which the server chose. With a seeded source (a local seed file) ``seed`` is mixed in, so
    the same file and seed give the same batches and noise.

    Parameters
    ----------
    model, optimizer : nn.Module, torch.optim.Optimizer
        An Opacus-compatible model (:func:`privacy.dpsgd.compat.make_opacus_compatible`) and its optimizer.
    num_samples, batch_size : int
        The client's dataset size n and the expected batch size B (capped at n).
    noise_multiplier, max_grad_norm : float
        sigma (>= 0; 0 warns: epsilon is infinite) and the clipping bound C (> 0).
    grad_sample_mode : str
        One of :data:`GRAD_SAMPLE_MODES`.
    seed : int
        Mixed into a seeded ``noise`` source only.
    poisson_sampling : bool
        Poisson-sampled batches (the accountant's assumption) or shuffled fixed-size batches.
    noise : NoiseSource or None
        The client's secret randomness; None: OS entropy.
    fast_samplers : bool
        Use :mod:`privacy.dpsgd.samplers` for this model (default); False: Opacus' own samplers.

    Returns
    -------
    PrivateTraining
    """
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import get_optimizer_class
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
    from opacus.validators import ModuleValidator

    if max_grad_norm <= 0:
        raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if noise_multiplier == 0:
        warnings.warn("DP-SGD with noise_multiplier = 0: clipping only, epsilon is infinite", stacklevel=2)
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, got {grad_sample_mode!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    model_params = set(model.parameters())
    if any(p not in model_params for group in optimizer.param_groups for p in group["params"]):
        raise ValueError("the optimizer holds parameters that are not the model's")
    batch_size = min(batch_size, num_samples)
    noise = noise or NoiseSource()
    g_data = torch.Generator().manual_seed(noise.torch_seed(STREAM_DPSGD, seed, 0))
    device = next(model.parameters()).device
    g_noise = torch.Generator(device=device).manual_seed(noise.torch_seed(STREAM_DPSGD, seed, 1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(num_samples)),
                                         batch_size=batch_size, shuffle=not poisson_sampling, generator=g_data)
    # PrivacyEngine.make_private's steps (Opacus 1.6), in its order, with the engine's defaults
    ModuleValidator.validate(model, strict=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
        warnings.filterwarnings("ignore", message=".*Full backward hook.*")
        wrapped = grad_sample_module(model, grad_sample_mode, max_grad_norm=max_grad_norm,
                                     fast_samplers=fast_samplers)
        if poisson_sampling:
            wrapped.forbid_grad_accumulation()
            dl = DPDataLoader.from_data_loader(loader)  # draws batches with the loader's generator, g_data
        else:
            dl = loader
        expected_batch_size = int(len(dl.dataset) * (1 / len(dl)))
        optimizer = get_optimizer_class(clipping="flat", distributed=False, grad_sample_mode=grad_sample_mode)(
            optimizer=optimizer, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size, loss_reduction="mean", generator=g_noise, secure_mode=False)
    criterion: nn.Module = nn.CrossEntropyLoss()
    if grad_sample_mode == "ghost":
        criterion = DPLossFastGradientClipping(wrapped, optimizer, criterion, loss_reduction="mean")
    # Opacus sets q = 1 / len(loader) = 1 / ceil(n / B) (not B / n) and 1 / q steps per epoch.
    rate = float(getattr(dl, "sample_rate", 1.0 / len(loader)))
    return PrivateTraining(wrapped, optimizer, dl, criterion, rate)


def ghost_clipping_backward(model: nn.Module, loss_per_sample: torch.Tensor, inputs: torch.Tensor) -> None:
    """Two-pass ghost clipping (as Opacus' ``DPLossFastGradientClipping.backward``).

    Leaves p.grad = the sum of clipped per-sample gradients; the DP optimizer then adds noise and
    averages. Pass 1 differentiates only w.r.t. ``inputs`` (which must require grad): the hooks need
    each layer's output gradient to compute per-sample gradient norms, not the parameter gradients
    that Opacus computes in this pass and throws away. Pass 2 backpropagates the clip-weighted loss
    without hooks.

    Parameters
    ----------
    model : nn.Module
        The model from :func:`make_private` with ``grad_sample_mode="ghost"``.
    loss_per_sample : torch.Tensor
        Unreduced loss, shape (batch,).
    inputs : torch.Tensor
        The batch fed to ``model``; must require grad.
    """
    if not inputs.requires_grad:
        raise ValueError("ghost_clipping_backward: inputs must require grad")
    torch.autograd.grad(loss_per_sample.mean(), inputs, retain_graph=True)  # the module uses loss_reduction="mean"
    coeff = model.get_clipping_coef()
    model.disable_hooks()
    try:
        (coeff.to(loss_per_sample.device) * loss_per_sample).sum().backward()
    finally:
        model.enable_hooks()


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside an Opacus wrapper (state-dict keys without '_module.')."""
    return getattr(model, "_module", model)
