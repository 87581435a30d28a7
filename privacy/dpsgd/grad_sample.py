"""Opacus GradSampleModules that use :mod:`privacy.dpsgd.samplers` for the wrapped model only.

Opacus looks samplers up as ``self.GRAD_SAMPLERS`` / ``self.NORM_SAMPLERS`` (class attributes shared
process-wide, filled by ``register_grad_sampler`` / ``register_norm_sampler``). The subclasses here
shadow them with a :class:`~collections.ChainMap` -- our samplers first, then Opacus' live registry
-- so a model wrapped by them gets the fast samplers (and anything registered with Opacus for other
layers), while ``GradSampleModule`` itself and every other wrapped model keep Opacus' own.

Their ``capture_backprops_hook`` is Opacus 1.6's with one change: per-sample gradients are stored
by :func:`store_grad_sample`, which skips Opacus' zero-filled copy of every per-sample gradient when
the batch is full. That method reads Opacus internals (``_current_grad_sample``, ``_forward_counter``,
``max_batch_len``); tests/privacy/test_privacy_dpsgd_scoping.py pins the Opacus sources it mirrors.
"""

from __future__ import annotations

from collections import ChainMap

import torch
from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping, prepare_module
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
from opacus.grad_sample.grad_sample_module import promote_current_grad_sample
from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import create_norm_sample
from opacus.grad_sample.gsm_base import AbstractGradSampleModule
from opacus.utils.module_utils import trainable_modules, trainable_parameters
from torch import nn

from privacy.dpsgd.book_keeping import BOOK_SAMPLERS, ClippedSum, contract_grad_samples
from privacy.dpsgd.samplers import FAST_GRAD_SAMPLERS, FAST_NORM_SAMPLERS


def store_grad_sample(*, param: torch.Tensor, grad_sample: torch.Tensor, max_batch_len: int) -> None:
    """Opacus' ``create_or_accumulate_grad_sample`` without its zero-filled copy for a full batch.

    Opacus allocates a zeroed (max_batch_len, *shape) buffer per parameter and copies the
    per-sample gradients into it on every step; when the batch is full the gradients can be
    kept as they are (a parameter used twice in one forward accumulates out of place).

    Parameters
    ----------
    param : torch.Tensor
        The parameter; the result goes to its ``_current_grad_sample`` (Opacus' slot).
    grad_sample : torch.Tensor
        Per-sample gradients, shape (batch, *param.shape); batch <= max_batch_len.
    max_batch_len : int
        The batch size the stored tensor must have (shorter ones are zero-padded).
    """
    if not param.requires_grad:
        return
    if hasattr(param, "_current_grad_sample"):
        cur = param._current_grad_sample
        n = grad_sample.shape[0]
        param._current_grad_sample = torch.cat([cur[:n] + grad_sample, cur[n:]]) if n < len(cur) else cur + grad_sample
    elif grad_sample.shape[0] == max_batch_len:
        param._current_grad_sample = grad_sample
    else:
        buf = grad_sample.new_zeros(torch.Size([max_batch_len]) + grad_sample.shape[1:])
        buf[: grad_sample.shape[0]] = grad_sample
        param._current_grad_sample = buf


class FastGradSampleModule(GradSampleModule):
    """Opacus' ``GradSampleModule`` (modes "hooks" and "functorch") with the fast samplers for this model."""

    GRAD_SAMPLERS = ChainMap(FAST_GRAD_SAMPLERS, GradSampleModule.GRAD_SAMPLERS)

    def capture_backprops_hook(self, module: nn.Module, _forward_input: torch.Tensor, forward_output: torch.Tensor,
                               loss_reduction: str, batch_first: bool) -> None:
        """Opacus 1.6's ``GradSampleHooks.capture_backprops_hook``, storing with :func:`store_grad_sample`."""
        if not self.hooks_enabled:
            return
        activations, backprops = self.rearrange_grad_samples(
            module=module, backprops=forward_output[0].detach(), loss_reduction=loss_reduction,
            batch_first=batch_first)
        if not self.force_functorch and type(module) in self.GRAD_SAMPLERS:
            grad_sampler_fn = self.GRAD_SAMPLERS[type(module)]
        else:
            grad_sampler_fn = ft_compute_per_sample_gradient
        for param, gs in grad_sampler_fn(module, activations, backprops).items():
            store_grad_sample(param=param, grad_sample=gs, max_batch_len=module.max_batch_len)
        # end of this module's backward for the batch: sum -> stack (RNNs, tied weights; Opacus #417)
        for _, p in trainable_parameters(module):
            p._forward_counter -= 1
            if p._forward_counter == 0:
                promote_current_grad_sample(p)
            if not self.grad_accumulation_allowed and isinstance(p.grad_sample, list) and len(p.grad_sample) > 1:
                raise ValueError("Poisson sampling is not compatible with grad accumulation. You need to call "
                                 "optimizer.step() after every forward/backward pass or consider using "
                                 "BatchMemoryManager")
        if len(module.activations) == 0 and hasattr(module, "max_batch_len"):
            del module.max_batch_len


class FastGhostClippingModule(GradSampleModuleFastGradientClipping):
    """Opacus' ``GradSampleModuleFastGradientClipping`` (mode "ghost") with the fast samplers for this model.

    Between :meth:`start_book_keeping` and :meth:`add_clipped_grads` (what
    :func:`privacy.dpsgd.engine.ghost_clipping_backward` does) the hooks also keep, per layer, what
    :mod:`privacy.dpsgd.book_keeping` needs to form the clipped gradient sum without a second backward pass.
    """

    GRAD_SAMPLERS = ChainMap(FAST_GRAD_SAMPLERS, GradSampleModuleFastGradientClipping.GRAD_SAMPLERS)
    NORM_SAMPLERS = ChainMap(FAST_NORM_SAMPLERS, GradSampleModuleFastGradientClipping.NORM_SAMPLERS)
    BOOK_SAMPLERS = BOOK_SAMPLERS

    _book: list[ClippedSum] | None = None

    def book_keeping_supported(self) -> bool:
        """True when every trainable layer has a book sampler or materializes its per-sample gradients."""
        return self.use_ghost_clipping and all(
            type(m) in self.BOOK_SAMPLERS or type(m) not in self.NORM_SAMPLERS
            for _, m in trainable_modules(self._module))

    def start_book_keeping(self) -> None:
        """Keep each layer's clipped-sum function during the next backward pass (:mod:`~privacy.dpsgd.book_keeping`)."""
        if not self.book_keeping_supported():
            raise ValueError("book keeping needs a book sampler for every layer with a norm sampler")
        self._book = []

    def add_clipped_grads(self, coef: torch.Tensor) -> None:
        """p.grad += sum_i coef_i grad_i L_i for every trainable parameter, from what the last backward pass kept."""
        book, self._book = self._book, None
        if book is None:
            raise RuntimeError("add_clipped_grads without start_book_keeping and a backward pass")
        for clipped_sum in book:
            for p, g in clipped_sum(coef).items():
                if p.grad is None:
                    p.grad = g.view_as(p)
                else:
                    p.grad.add_(g.view_as(p))

    def capture_backprops_hook(self, module: nn.Module, _forward_input: torch.Tensor, forward_output: torch.Tensor,
                               loss_reduction: str, batch_first: bool) -> None:
        """Opacus 1.6's ``GradSampleHooksFastGradientClipping.capture_backprops_hook``, storing with
        :func:`store_grad_sample`, and keeping the clipped-sum functions while book keeping."""
        if not self.hooks_enabled:
            return
        activations, backprops = self.rearrange_grad_samples(
            module=module, backprops=forward_output[0].detach(), loss_reduction=loss_reduction,
            batch_first=batch_first)
        activations = [t.to_local() if type(t) is torch.distributed.tensor.DTensor else t for t in activations]
        book = self._book
        if book is not None and self.use_ghost_clipping and type(module) in self.BOOK_SAMPLERS:
            norms, clipped_sum = self.BOOK_SAMPLERS[type(module)](module, activations, backprops)
            for param, ns in norms.items():
                if param.requires_grad:
                    param._norm_sample = ns
                    param._forward_counter -= 1
            book.append(clipped_sum)
        elif self.use_ghost_clipping and type(module) in self.NORM_SAMPLERS:
            for param, ns in self.NORM_SAMPLERS[type(module)](module, activations, backprops).items():
                if param.requires_grad:
                    param._norm_sample = ns
                    param._forward_counter -= 1
        else:
            if not self.force_functorch and type(module) in self.GRAD_SAMPLERS:
                grad_sampler_fn = self.GRAD_SAMPLERS[type(module)]
            else:
                grad_sampler_fn = ft_compute_per_sample_gradient
            for param, gs in grad_sampler_fn(module, activations, backprops).items():
                store_grad_sample(param=param, grad_sample=gs, max_batch_len=module.max_batch_len)
            for _, p in trainable_parameters(module):
                p._forward_counter -= 1
                if p._forward_counter == 0:
                    promote_current_grad_sample(p)
                    create_norm_sample(param=p, grad_sample=p.grad_sample, max_batch_len=module.max_batch_len)
                    if book is not None:  # the per-sample gradients exist: the clipped sum contracts them
                        book.append(contract_grad_samples({p: p.grad_sample}))
                    p.grad_sample = None
        if len(module.activations) == 0 and hasattr(module, "max_batch_len"):
            del module.max_batch_len


def grad_sample_module(model: nn.Module, grad_sample_mode: str, *, max_grad_norm: float,
                       fast_samplers: bool = True) -> AbstractGradSampleModule:
    """Wrap ``model`` for per-sample gradients as ``PrivacyEngine.make_private`` does (batch first, mean loss).

    Parameters
    ----------
    model : nn.Module
        The Opacus-compatible model.
    grad_sample_mode : str
        "hooks", "functorch", "ew" or "ghost" (Opacus' names).
    max_grad_norm : float
        Clipping bound C; ghost clipping computes its clipping coefficients from it.
    fast_samplers : bool
        True: :class:`FastGradSampleModule` / :class:`FastGhostClippingModule`, i.e. the fast samplers
        for this model. False: Opacus' own class and samplers ("ew" never uses samplers).

    Returns
    -------
    AbstractGradSampleModule
        The wrapped model.
    """
    kwargs: dict = {"batch_first": True, "loss_reduction": "mean"}
    if grad_sample_mode == "ghost":
        kwargs["max_grad_norm"] = max_grad_norm
    if not fast_samplers or grad_sample_mode == "ew":
        return prepare_module(model, grad_sample_mode, **kwargs)
    if grad_sample_mode in ("hooks", "functorch"):
        return FastGradSampleModule(model, force_functorch=grad_sample_mode == "functorch", **kwargs)
    if grad_sample_mode == "ghost":
        return FastGhostClippingModule(model, **kwargs)
    raise ValueError(f"grad_sample_mode must be one of hooks, functorch, ew, ghost; got {grad_sample_mode!r}")
