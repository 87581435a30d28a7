"""Opacus GradSampleModules that use :mod:`privacy.dpsgd.samplers` for the wrapped model only.

Opacus looks samplers up as ``self.GRAD_SAMPLERS`` / ``self.NORM_SAMPLERS`` (class attributes shared
process-wide, filled by ``register_grad_sampler`` / ``register_norm_sampler``). The subclasses here
shadow them with a :class:`~collections.ChainMap` -- our samplers first, then Opacus' live registry
-- so a model wrapped by them gets the fast samplers (and anything registered with Opacus for other
layers), while ``GradSampleModule`` itself and every other wrapped model keep Opacus' own.

Their ``capture_backprops_hook`` is Opacus 1.6's with one change: per-sample gradients are stored
by :func:`~privacy.dpsgd.opacus_adapter.store_grad_sample`, which skips Opacus' zero-filled copy of every
per-sample gradient when the batch is full. The Opacus internals that hook reads and writes
(``_current_grad_sample``, ``_forward_counter``, ``_norm_sample``, ``max_batch_len``, ``_module``) are
reached through :mod:`privacy.dpsgd.opacus_adapter` (version-gated); tests/privacy/test_privacy_dpsgd_scoping.py
pins the Opacus sources it mirrors.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import MutableMapping
from typing import cast

import torch
from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping, prepare_module
from opacus.grad_sample.gsm_base import AbstractGradSampleModule
from opacus.utils.module_utils import trainable_modules, trainable_parameters
from torch import nn

from privacy.dpsgd.book_keeping import BOOK_SAMPLERS, ClippedSum, contract_grad_samples
from privacy.dpsgd.opacus_adapter import (
    create_norm_sample,
    finish_module_backward,
    ft_compute_per_sample_gradient,
    max_batch_len,
    parameter_backward_done,
    promote_current_grad_sample,
    record_norm_sample,
    require_opacus,
    store_grad_sample,
    wrapped_module,
)
from privacy.dpsgd.samplers import FAST_GRAD_SAMPLERS, FAST_NORM_SAMPLERS, Sampler

# ChainMap is typed over mutable maps; the chains below are only read (our read-only maps come first)
_Samplers = MutableMapping[type[nn.Module], Sampler]

__all__ = ["FastGhostClippingModule", "FastGradSampleModule", "grad_sample_module", "store_grad_sample"]


class FastGradSampleModule(GradSampleModule):
    """Opacus' ``GradSampleModule`` (modes "hooks" and "functorch") with the fast samplers for this model."""

    GRAD_SAMPLERS = ChainMap(cast(_Samplers, FAST_GRAD_SAMPLERS), GradSampleModule.GRAD_SAMPLERS)

    def __init__(self, *args, **kwargs) -> None:
        require_opacus("FastGradSampleModule")
        super().__init__(*args, **kwargs)

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
            store_grad_sample(param=param, grad_sample=gs, max_batch_len=max_batch_len(module))
        # end of this module's backward for the batch: sum -> stack (RNNs, tied weights; Opacus #417)
        for _, p in trainable_parameters(module):
            if parameter_backward_done(p):
                promote_current_grad_sample(p)
            if not self.grad_accumulation_allowed and isinstance(p.grad_sample, list) and len(p.grad_sample) > 1:
                raise ValueError("Poisson sampling is not compatible with grad accumulation. You need to call "
                                 "optimizer.step() after every forward/backward pass or consider using "
                                 "BatchMemoryManager")
        finish_module_backward(module)


class FastGhostClippingModule(GradSampleModuleFastGradientClipping):
    """Opacus' ``GradSampleModuleFastGradientClipping`` (mode "ghost") with the fast samplers for this model.

    Between :meth:`start_book_keeping` and :meth:`add_clipped_grads` (what
    :func:`privacy.dpsgd.engine.ghost_clipping_backward` does) the hooks also keep, per layer, what
    :mod:`privacy.dpsgd.book_keeping` needs to form the clipped gradient sum without a second backward pass.
    """

    GRAD_SAMPLERS = ChainMap(cast(_Samplers, FAST_GRAD_SAMPLERS), GradSampleModuleFastGradientClipping.GRAD_SAMPLERS)
    NORM_SAMPLERS = ChainMap(cast(_Samplers, FAST_NORM_SAMPLERS), GradSampleModuleFastGradientClipping.NORM_SAMPLERS)
    BOOK_SAMPLERS = BOOK_SAMPLERS

    _book: list[ClippedSum] | None = None

    def __init__(self, *args, **kwargs) -> None:
        require_opacus("FastGhostClippingModule")
        super().__init__(*args, **kwargs)

    def book_keeping_supported(self) -> bool:
        """True when every trainable layer has a book sampler or materializes its per-sample gradients."""
        return self.use_ghost_clipping and all(
            type(m) in self.BOOK_SAMPLERS or type(m) not in self.NORM_SAMPLERS
            for _, m in trainable_modules(wrapped_module(self)))

    def start_book_keeping(self) -> None:
        """Keep each layer's clipped-sum function during the next backward pass (:mod:`~privacy.dpsgd.book_keeping`)."""
        if not self.book_keeping_supported():
            raise ValueError("book keeping needs a book sampler for every layer with a norm sampler")
        self._book = []

    def abort_book_keeping(self) -> None:
        """Drop what a failed backward pass kept, so nothing half-kept survives into a later step."""
        self._book = None

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
                    record_norm_sample(param, ns)
            book.append(clipped_sum)
        elif self.use_ghost_clipping and type(module) in self.NORM_SAMPLERS:
            for param, ns in self.NORM_SAMPLERS[type(module)](module, activations, backprops).items():
                if param.requires_grad:
                    record_norm_sample(param, ns)
        else:
            if not self.force_functorch and type(module) in self.GRAD_SAMPLERS:
                grad_sampler_fn = self.GRAD_SAMPLERS[type(module)]
            else:
                grad_sampler_fn = ft_compute_per_sample_gradient
            for param, gs in grad_sampler_fn(module, activations, backprops).items():
                store_grad_sample(param=param, grad_sample=gs, max_batch_len=max_batch_len(module))
            for _, p in trainable_parameters(module):
                if parameter_backward_done(p):
                    promote_current_grad_sample(p)
                    create_norm_sample(param=p, grad_sample=p.grad_sample, max_batch_len=max_batch_len(module))
                    if book is not None:  # the per-sample gradients exist: the clipped sum contracts them
                        book.append(contract_grad_samples({p: p.grad_sample}))
                    p.grad_sample = None
        finish_module_backward(module)


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
    require_opacus("grad_sample_module")
    if not fast_samplers or grad_sample_mode == "ew":
        return prepare_module(model, grad_sample_mode, **kwargs)
    if grad_sample_mode in ("hooks", "functorch"):
        return FastGradSampleModule(model, force_functorch=grad_sample_mode == "functorch", **kwargs)
    if grad_sample_mode == "ghost":
        return FastGhostClippingModule(model, **kwargs)
    raise ValueError(f"grad_sample_mode must be one of hooks, functorch, ew, ghost; got {grad_sample_mode!r}")
