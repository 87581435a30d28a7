"""Client-side DP-SGD wiring: Opacus' ``PrivacyEngine.make_private`` over a loader of indices, ghost clipping.

:func:`make_private` assembles what ``PrivacyEngine.make_private`` assembles, from the same public
Opacus parts (``DPDataLoader``, ``get_optimizer_class``, ``DPLossFastGradientClipping``), so that the
model can be wrapped by :func:`privacy.dpsgd.grad_sample.grad_sample_module`: the engine only
accepts a pre-wrapped model of Opacus' exact class. That is how the fast samplers reach this model
and no other. The engine's accountant is left out on purpose: epsilon comes from
:class:`privacy.dpsgd.ledger.DpSgdLedger`, which the caller fills.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch
from opacus.optimizers import DPOptimizerFastGradientClipping
from torch import nn

from privacy.dpsgd.canaries import GradientCanaries, with_gradient_canaries
from privacy.dpsgd.grad_sample import grad_sample_module
from privacy.dpsgd.opacus_adapter import (
    check_processed_flag,
    effective_noise_multiplier,
    mark_as_processed,
    require_opacus,
    step_skip_pending,
    wrapped_module,
)
from privacy.randomness import STREAM_DPSGD, NoiseSource

GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew", "ghost")


class DPOptimizerLike(Protocol):
    """What Opacus' DP optimizer adds to the torch optimizer it wraps (for the type checker: Opacus ships no types)."""

    params: list[nn.Parameter]
    original_optimizer: torch.optim.Optimizer
    expected_batch_size: int

    def pre_step(self, closure: Callable[[], float] | None = None) -> bool: ...
    def zero_grad(self, set_to_none: bool = True) -> None: ...


class _CanaryOptimizerLike(DPOptimizerLike, Protocol):
    gradient_canaries: GradientCanaries


class _GhostClippingModuleLike(Protocol):
    """The methods of Opacus' ghost-clipping module (and :class:`FastGhostClippingModule`) used here."""

    def book_keeping_supported(self) -> bool: ...
    def start_book_keeping(self) -> None: ...
    def abort_book_keeping(self) -> None: ...
    def add_clipped_grads(self, coef: torch.Tensor) -> None: ...
    def get_clipping_coef(self) -> torch.Tensor: ...
    def disable_hooks(self) -> None: ...
    def enable_hooks(self) -> None: ...


class CopyFreeFastGradientClippingOptimizer(DPOptimizerFastGradientClipping):
    """Opacus' ghost-clipping DP optimizer with the same noise draws and arithmetic, without its per-step copies.

    Per parameter and step, Opacus deep-copies p.grad into ``summed_grad``, allocates a zero tensor it
    discards, a fresh noise tensor and a fresh sum: four passes over |theta| floats beside the noise draw
    itself (0.1-0.2 s per step at ViT-small / ResNet-50 size on one CPU thread). Here ``summed_grad`` is
    p.grad itself (unless a skipped step keeps it across backward passes), the noise is drawn into one
    reused buffer -- ``normal_`` on a contiguous tensor of the parameter's shape, the same generator
    stream as Opacus' ``torch.normal(0, std, size)`` -- and added in place (same rounding as
    ``summed_grad + noise``). ``secure_mode`` noise is left to Opacus. The Opacus internals both methods
    read go through :mod:`privacy.dpsgd.opacus_adapter`.
    """

    _noise_buffer: torch.Tensor | None = None

    def __init__(self, *args, **kwargs) -> None:
        require_opacus("CopyFreeFastGradientClippingOptimizer")
        super().__init__(*args, **kwargs)

    def accumulate(self) -> None:
        if step_skip_pending(self):  # a skipped step keeps summed_grad across backward passes: Opacus' copy
            super().accumulate()
            return
        for p in self.params:
            if p.summed_grad is not None:
                p.summed_grad.add_(p.grad.data)
            else:
                p.summed_grad = p.grad.data

    def add_noise(self) -> None:
        if self.secure_mode:
            super().add_noise()
            return
        std = effective_noise_multiplier(self) * self.max_grad_norm
        for p in self.params:
            check_processed_flag(p.summed_grad)
            summed = p.summed_grad
            if std != 0:
                buf = self._noise_buffer
                if (buf is None or buf.numel() < summed.numel() or buf.dtype != summed.dtype
                        or buf.device != summed.device):
                    numel = max(q.numel() for q in self.params)
                    buf = self._noise_buffer = torch.empty(numel, dtype=summed.dtype, device=summed.device)
                noise = buf[: summed.numel()].view(summed.shape).normal_(0, std, generator=self.generator)
                summed = summed.add_(noise) if summed.is_contiguous() else summed + noise
            p.grad = summed.view_as(p)
            mark_as_processed(p.summed_grad)


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
                 fast_samplers: bool = True, gradient_canaries: GradientCanaries | None = None) -> PrivateTraining:
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
    gradient_canaries : GradientCanaries or None
        An auditor's white-box gradient canaries (:mod:`privacy.dpsgd.canaries`): inserted into the
        clipped sum of every step before the optimizer's noise, observed after it. None (default): the
        optimizer is the plain one.

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
    require_opacus("make_private")
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
        optimizer_cls = get_optimizer_class(clipping="flat", distributed=False, grad_sample_mode=grad_sample_mode)
        if fast_samplers and optimizer_cls is DPOptimizerFastGradientClipping:
            optimizer_cls = CopyFreeFastGradientClippingOptimizer
        if gradient_canaries is not None:
            optimizer_cls = with_gradient_canaries(optimizer_cls)
        optimizer = optimizer_cls(
            optimizer=optimizer, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size, loss_reduction="mean", generator=g_noise, secure_mode=False)
    criterion: nn.Module = nn.CrossEntropyLoss()
    if grad_sample_mode == "ghost":
        criterion = DPLossFastGradientClipping(wrapped, optimizer, criterion, loss_reduction="mean")
    # Opacus sets q = 1 / len(loader) = 1 / ceil(n / B) (not B / n) and 1 / q steps per epoch.
    rate = float(getattr(dl, "sample_rate", 1.0 / len(loader)))
    if gradient_canaries is not None:
        gradient_canaries.bind(cast(DPOptimizerLike, optimizer).params, rate)  # sampled at the loader's rate q
        cast(_CanaryOptimizerLike, optimizer).gradient_canaries = gradient_canaries
    return PrivateTraining(wrapped, optimizer, dl, criterion, rate)


def first_layer_trains(model: nn.Module) -> bool:
    """Whether the first module (registration order) that holds parameters trains any of them."""
    for m in model.modules():
        own = list(m.parameters(recurse=False))
        if own:
            return any(p.requires_grad for p in own)
    return False


def ghost_targets(model: nn.Module, batch: torch.Tensor) -> list[torch.Tensor]:
    """What :func:`ghost_clipping_backward` should differentiate: the batch (made to require grad) when
    the model's first layer trains, else its trainable parameters (a frozen prefix is never backpropagated)."""
    if first_layer_trains(model):
        return [batch.requires_grad_(True)]
    return [p for p in model.parameters() if p.requires_grad]


def ghost_clipping_backward(model: nn.Module, loss_per_sample: torch.Tensor,
                            inputs: torch.Tensor | Sequence[torch.Tensor], *, book_keeping: bool = True) -> None:
    """Ghost clipping: p.grad += the sum of clipped per-sample gradients (as Opacus' ``DPLossFastGradientClipping``).

    The DP optimizer then adds noise and averages. The backward pass differentiates only w.r.t.
    ``inputs`` (which must require grad): the hooks need each layer's output gradient to compute
    per-sample gradient norms, not the parameter gradients that Opacus computes in this pass and
    throws away. ``inputs`` is the batch when the first layer trains; when a frozen prefix comes
    first (e.g. only the head trains), pass the trainable parameters instead (:func:`ghost_targets`):
    the pass then stops at the first trainable layer instead of running back through the frozen ones.
    With ``book_keeping`` (default, where every layer supports it) the clipped sum is then formed layer
    by layer from what that pass kept (:mod:`privacy.dpsgd.book_keeping`, Bu et al. 2023's BK);
    otherwise the clip-weighted loss is backpropagated a second time, without hooks.
    Both give the same gradients up to float rounding (tested).

    Parameters
    ----------
    model : nn.Module
        The model from :func:`make_private` with ``grad_sample_mode="ghost"``.
    loss_per_sample : torch.Tensor
        Unreduced loss, shape (batch,).
    inputs : torch.Tensor or sequence of torch.Tensor
        What the first pass differentiates: the batch fed to ``model``, or the trainable parameters;
        must require grad.
    book_keeping : bool
        False: always take the second backward pass.
    """
    targets = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    if not targets or not all(t.requires_grad for t in targets):
        raise ValueError("ghost_clipping_backward: inputs must require grad")
    ghost = cast(_GhostClippingModuleLike, model)  # the same object, typed (nn.Module.__getattr__ says Tensor | Module)
    book = (book_keeping and len(loss_per_sample) > 0 and hasattr(model, "start_book_keeping")
            and ghost.book_keeping_supported())
    if book:
        ghost.start_book_keeping()
    try:  # the module uses loss_reduction="mean"
        torch.autograd.grad(loss_per_sample.mean(), targets, retain_graph=not book, allow_unused=True)
        coeff = ghost.get_clipping_coef().to(loss_per_sample.device)
    except BaseException:
        if book:
            ghost.abort_book_keeping()  # nothing half-kept survives into a later step
        raise
    if book:
        ghost.add_clipped_grads(coeff)
        return
    ghost.disable_hooks()
    try:
        (coeff * loss_per_sample).sum().backward()
    finally:
        ghost.enable_hooks()


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside an Opacus wrapper (state-dict keys without '_module.')."""
    return wrapped_module(model)
