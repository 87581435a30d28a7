"""Every Opacus internal that privacy.dpsgd reads or writes, in one place, gated on Opacus 1.6.0.

The fast grad-sample modules (:mod:`privacy.dpsgd.grad_sample`) mirror Opacus' backward hook with one
change, and the copy-free optimizer (:mod:`privacy.dpsgd.engine`) mirrors Opacus' ghost-clipping
``add_noise`` / ``accumulate`` without their copies. Both have to speak Opacus' private protocol
(attributes it puts on parameters and modules, module-level helpers with a leading underscore). Each
access is a function here; the other modules call these and touch no Opacus private name. Before any
of them is used, :func:`require_opacus` checks the installed Opacus against :data:`OPACUS` (raises
:class:`~registry.third_party.UntestedVersionError` otherwise): :func:`privacy.dpsgd.engine.make_private`
and the constructors of the fast modules and the copy-free optimizer call it.

What each access is for (-> the upstream public alternative, if any):

* ``opacus.optimizers.optimizer._check_processed_flag`` / ``_mark_as_processed``: the copy-free
  ``add_noise`` keeps Opacus' guard against noising one clipped sum twice (-> none; Opacus'
  ``DPOptimizer.add_noise`` does it internally).
* ``DPOptimizer._step_skip_queue``: the copy-free ``accumulate`` defers to Opacus' copy when a step will be
  skipped (``signal_skip_step``, virtual steps) (-> none; ``signal_skip_step`` only writes it).
* ``optimizer._adjusted_noise_multiplier``: the noise std Opacus' own ``add_noise`` uses (adaptive
  clipping sets it; otherwise ``noise_multiplier``) (-> none).
* ``param._current_grad_sample``: :func:`store_grad_sample` fills the per-sample gradient slot of Opacus'
  hook without its zero-filled copy (-> ``opacus.grad_sample.create_or_accumulate_grad_sample``, which
  copies every step).
* ``param._forward_counter``, ``param._norm_sample``: the hook's count of pending backward passes per
  parameter and ghost clipping's per-sample norm slot (-> none).
* ``module.max_batch_len``, ``module.activations``: the hook's per-module batch length and activation
  stack (-> none).
* ``GradSampleModule._module``: the user's module inside the wrapper, :func:`wrapped_module` (-> none;
  its ``state_dict`` keys carry ``_module.``).
* ``promote_current_grad_sample``, ``create_norm_sample``, ``ft_compute_per_sample_gradient`` (not
  exported by ``opacus.grad_sample``): Opacus' own steps of the hook that our mirror of it calls (-> none).

Opacus' ``GradSampleModule._close`` (ultrasound's old teardown) is no longer used: it only calls the
public ``cleanup()``. ``privacy.opacus_import`` reads nothing private (it imports Opacus with a
temporary root log handler). The Opacus sources this module and the mirrored hooks depend on are pinned
by hash in tests/privacy/test_privacy_dpsgd_scoping.py; tests/privacy/test_opacus_adapter.py checks the
fast paths against stock Opacus (same step under the same seeded noise, same per-sample gradients).
"""

from __future__ import annotations

from typing import cast

import torch
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
from opacus.grad_sample.grad_sample_module import promote_current_grad_sample
from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import create_norm_sample
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import nn

from registry.third_party import VersionGate

OPACUS = VersionGate("opacus", "==1.6.0", adapter="privacy/dpsgd/opacus_adapter.py",
                     tests="tests/privacy/test_opacus_adapter.py and tests/privacy/test_privacy_dpsgd_scoping.py")

__all__ = [
    "OPACUS", "check_processed_flag", "create_norm_sample", "effective_noise_multiplier", "finish_module_backward",
    "ft_compute_per_sample_gradient", "mark_as_processed", "max_batch_len", "parameter_backward_done",
    "promote_current_grad_sample", "record_norm_sample", "require_opacus", "step_skip_pending",
    "store_grad_sample", "wrapped_module",
]


def require_opacus(access: str = "privacy.dpsgd's fast DP-SGD path") -> None:
    """Raise unless the installed Opacus is the version these internals were tested with (:data:`OPACUS`)."""
    OPACUS.require(access)


# -- the DP optimizer ---------------------------------------------------------------------------------------

def check_processed_flag(summed_grad: torch.Tensor) -> None:
    """Opacus' guard: raise if this clipped sum was already noised (``_check_processed_flag``)."""
    _check_processed_flag(summed_grad)


def mark_as_processed(summed_grad: torch.Tensor) -> None:
    """Mark a clipped sum as noised (``_mark_as_processed``), as Opacus' ``add_noise`` does."""
    _mark_as_processed(summed_grad)


def step_skip_pending(optimizer: DPOptimizer) -> bool:
    """Whether the DP optimizer holds skip signals (``_step_skip_queue`` not empty: virtual steps)."""
    return bool(optimizer._step_skip_queue)


def effective_noise_multiplier(optimizer: DPOptimizer) -> float:
    """The noise multiplier Opacus' ``add_noise`` draws with: ``_adjusted_noise_multiplier`` if set, else
    ``noise_multiplier``."""
    return cast(float, getattr(optimizer, "_adjusted_noise_multiplier", optimizer.noise_multiplier))


# -- the backward hook's slots on parameters and modules ------------------------------------------------------

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
        param._current_grad_sample = grad_sample  # type: ignore[attr-defined]
    else:
        buf = grad_sample.new_zeros(torch.Size([max_batch_len]) + grad_sample.shape[1:])
        buf[: grad_sample.shape[0]] = grad_sample
        param._current_grad_sample = buf  # type: ignore[attr-defined]


def parameter_backward_done(param: torch.Tensor) -> bool:
    """One backward pass through ``param``'s module is done (``_forward_counter -= 1``); True when it was the
    last pending one (the summed per-sample gradient is then complete)."""
    param._forward_counter -= 1  # type: ignore[attr-defined]
    return param._forward_counter == 0  # type: ignore[attr-defined]


def record_norm_sample(param: torch.Tensor, norm_sample: torch.Tensor) -> None:
    """Ghost clipping: keep ``param``'s per-sample gradient norms (``_norm_sample``) and count the pass done."""
    param._norm_sample = norm_sample  # type: ignore[attr-defined]
    param._forward_counter -= 1  # type: ignore[attr-defined]


def max_batch_len(module: nn.Module) -> int:
    """The batch length Opacus' forward hook recorded on ``module``."""
    return module.max_batch_len  # type: ignore[return-value]


def finish_module_backward(module: nn.Module) -> None:
    """After the hook's last pending activation of ``module``: drop its ``max_batch_len`` (as Opacus does)."""
    if len(module.activations) == 0 and hasattr(module, "max_batch_len"):  # type: ignore[arg-type]
        del module.max_batch_len


def wrapped_module(model: nn.Module) -> nn.Module:
    """The user's module inside an Opacus wrapper (``_module``; state-dict keys without '_module.'), or ``model``."""
    inner = getattr(model, "_module", model)
    assert isinstance(inner, nn.Module)
    return inner
