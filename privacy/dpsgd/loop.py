"""A DP-SGD client training loop for any torch model and input shape (Abadi et al. 2016, Algorithm 1).

Each step draws a Poisson-sampled batch (every example independently with rate q), clips each
example's gradient to ``max_grad_norm``, adds N(0, (noise_multiplier * max_grad_norm)^2) to the sum
and divides by the expected batch size: :func:`privacy.dpsgd.engine.make_private` does the wiring
(Opacus' DP optimizer, the client's secret :class:`~privacy.randomness.NoiseSource`). An empty batch
still takes its noisy step, as Opacus does and as the accountant assumes: skipping it would release
"no example was sampled" in the clear. The steps go into a :class:`~privacy.dpsgd.ledger.DpSgdLedger`,
whose :func:`~privacy.dpsgd.ledger.rdp_epsilon` is the reported epsilon.

Nothing here knows about images or channels: ``x`` is any tensor whose first dimension indexes examples.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from privacy.dpsgd.calibrate import sample_rate as poisson_rate
from privacy.dpsgd.engine import (
    GRAD_SAMPLE_MODES,
    DPOptimizerLike,
    ghost_clipping_backward,
    ghost_targets,
    make_private,
)
from privacy.dpsgd.ledger import DpSgdLedger, rdp_epsilon
from privacy.randomness import NoiseSource

# "ew" (torch's expanded weights) refuses a batch of 0 examples, which Poisson sampling draws
LOOP_GRAD_SAMPLE_MODES = tuple(m for m in GRAD_SAMPLE_MODES if m != "ew")

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class DpSgdStats:
    """What one call of :func:`train_dp_sgd` did; ``epsilon`` at ``delta`` from its ledger (RDP)."""

    steps: int
    empty_steps: int  # steps whose Poisson batch was empty (a pure-noise step)
    examples: int  # examples drawn over all steps
    mean_loss: float  # mean per-example training loss over the drawn examples (nan if none)
    sample_rate: float
    expected_batch_size: int  # the divisor of the noised sum
    noise_multiplier: float
    max_grad_norm: float
    delta: float
    epsilon: float


@dataclass
class DpSgdResult:
    """The trained model (the caller's module, trained in place, Opacus' hooks removed), stats, ledger."""

    model: nn.Module
    stats: DpSgdStats
    ledger: DpSgdLedger


def _check_inputs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float | None,
                  optimizer: OptimizerFactory | None, epochs: int | None, steps: int | None, batch_size: int,
                  noise_multiplier: float, max_grad_norm: float, delta: float, grad_sample_mode: str) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError(f"x and y must be torch tensors, got {type(x).__name__} and {type(y).__name__}")
    if x.ndim < 1 or y.ndim < 1:
        raise ValueError(f"x and y need a first (example) dimension, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if len(x) != len(y):
        raise ValueError(f"x and y must hold the same number of examples, got {len(x)} and {len(y)}")
    if len(x) == 0:
        raise ValueError("cannot train on an empty dataset")
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise ValueError("x holds non-finite values")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be an int > 0, got {batch_size!r}")
    if batch_size > len(x):
        raise ValueError(f"batch_size must be <= the number of examples {len(x)}, got {batch_size}")
    if not noise_multiplier >= 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if (epochs is None) == (steps is None):
        raise ValueError(f"give exactly one of epochs and steps, got epochs={epochs}, steps={steps}")
    for name, value in (("epochs", epochs), ("steps", steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if (lr is None) == (optimizer is None):
        raise ValueError("give exactly one of lr (plain SGD) and optimizer (a factory of the parameters)")
    if lr is not None and not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if grad_sample_mode not in LOOP_GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {LOOP_GRAD_SAMPLE_MODES}, got {grad_sample_mode!r}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("the model has no trainable parameters")


def train_dp_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, noise_multiplier: float,
                 max_grad_norm: float, epochs: int | None = None, steps: int | None = None, lr: float | None = None,
                 optimizer: OptimizerFactory | None = None, loss: Loss | None = None, delta: float = 1e-5,
                 seed: int = 0, noise: NoiseSource | None = None, grad_sample_mode: str = "hooks",
                 on_step: Callable[[int, int, nn.Module], None] | None = None) -> DpSgdResult:
    """Train ``model`` in place with DP-SGD on examples ``x`` (any shape (n, ...)) and targets ``y`` (n, ...).

    Threat model: the noise and the Poisson sampling come from ``noise``, the client's own secret
    source (OS entropy by default), never from ``seed``, which a server may have chosen; ``seed`` is
    only mixed into a *seeded* source (privacy.randomness), where the same file and seed give
    bit-identical parameters.

    Parameters
    ----------
    model : nn.Module
        Opacus-compatible (no BatchNorm: :func:`privacy.dpsgd.compat.make_opacus_compatible`); trained in place.
    x, y : torch.Tensor
        Examples and targets, indexed by their first dimension; batches are moved to the model's device.
    batch_size : int
        Expected batch size B (1 <= B <= n); the sample rate is q = 1 / ceil(n / B)
        (:func:`privacy.dpsgd.calibrate.sample_rate`).
    noise_multiplier, max_grad_norm : float
        sigma (>= 0; 0 warns: epsilon is infinite) and the per-example clip norm C (> 0).
    epochs, steps : int or None
        Exactly one: epochs of 1/q Poisson steps each, or a number of steps.
    lr, optimizer : float or None, callable or None
        Exactly one: plain SGD with this lr, or a factory called with the trainable parameters.
    loss : callable or None
        ``loss(output, target)`` -> one loss per example, shape (batch,) (torch losses with
        ``reduction="none"``); the step differentiates their mean. Default: cross-entropy.
    delta : float
        The delta of the reported epsilon, in (0, 1).
    seed : int
        Mixed into a seeded ``noise`` source only.
    noise : NoiseSource or None
        The client's secret randomness; None: OS entropy.
    grad_sample_mode : str
        One of :data:`LOOP_GRAD_SAMPLE_MODES` ("hooks", "functorch", "ghost").
    on_step : callable or None
        Called after every step as ``on_step(step, batch_len, model)`` (1-based step, the model unwrapped).

    Returns
    -------
    DpSgdResult
    """
    _check_inputs(model, x, y, lr, optimizer, epochs, steps, batch_size, noise_multiplier, max_grad_norm, delta,
                  grad_sample_mode)
    n = len(x)
    q = poisson_rate(batch_size, n)
    total_steps = steps if steps is not None else cast(int, epochs) * round(1 / q)  # _check_inputs: one is set
    loss_fn: Loss = loss if loss is not None else nn.CrossEntropyLoss(reduction="none")
    params = [p for p in model.parameters() if p.requires_grad]
    base_opt = torch.optim.SGD(params, lr=cast(float, lr)) if optimizer is None else optimizer(params)
    model.train()
    pt = make_private(model, base_opt, n, batch_size, noise_multiplier=noise_multiplier,  # sigma = 0 warns there
                      max_grad_norm=max_grad_norm, grad_sample_mode=grad_sample_mode, seed=seed,
                      poisson_sampling=True, noise=noise)
    if pt.sample_rate != q:  # the accountant must see the rate the loader samples with
        raise RuntimeError(f"make_private samples at q={pt.sample_rate}, expected {q}")
    net, opt = pt.model, cast(DPOptimizerLike, pt.optimizer)  # Opacus' DP optimizer (make_private)
    device = next(model.parameters()).device
    ledger = DpSgdLedger()
    done = empty = seen = 0
    loss_sum = 0.0
    try:
        while done < total_steps:
            for (idx,) in pt.loader:  # one pass: 1/q Poisson batches drawn from the secret generator
                xb, yb = x[idx].to(device), y[idx].to(device)
                opt.zero_grad(set_to_none=True)
                if len(idx) == 0 and grad_sample_mode == "ghost":
                    # ghost clipping's norm hooks see no example; the clipped sum over none is zero, and the
                    # DP optimizer adds the step's noise to it (the ghost optimizer reads p.grad)
                    for p in params:
                        p.grad = torch.zeros_like(p)
                else:
                    with warnings.catch_warnings():  # Opacus' hooks on the first layer: benign
                        warnings.filterwarnings("ignore", message="Full backward hook is firing")
                        # ghost: the batch must require grad before the forward pass builds the graph
                        targets = ghost_targets(net, xb) if grad_sample_mode == "ghost" else None
                        losses = loss_fn(net(xb), yb)
                        if losses.shape != (len(idx),):
                            raise ValueError(f"loss must return one loss per example (reduction='none'): shape "
                                             f"({len(idx)},), got {tuple(losses.shape)}")
                        if targets is not None:
                            ghost_clipping_backward(net, losses, targets)
                        else:  # the mean (Opacus' loss_reduction="mean"); an empty batch's sum is 0, not nan
                            (losses.sum() / max(len(idx), 1)).backward()
                    loss_sum += float(losses.detach().sum())
                if opt.pre_step():  # clip, sum, add noise, divide by the expected batch size
                    opt.original_optimizer.step()
                done += 1
                empty += len(idx) == 0
                seen += len(idx)
                if on_step is not None:
                    on_step(done, len(idx), model)
                if done == total_steps:
                    break
    finally:
        opt.zero_grad(set_to_none=True)
        # Opacus' public teardown: hooks removed, grad_sample & co. deleted from the parameters
        cast(Callable[[], None], net.cleanup)()
        for p in params:  # the DP optimizer's attribute, which that teardown leaves (set to None)
            if hasattr(p, "summed_grad"):
                del p.summed_grad
    ledger.record(noise_multiplier, q, done)
    stats = DpSgdStats(steps=done, empty_steps=empty, examples=seen,
                       mean_loss=loss_sum / seen if seen else float("nan"), sample_rate=q,
                       expected_batch_size=int(opt.expected_batch_size), noise_multiplier=float(noise_multiplier),
                       max_grad_norm=float(max_grad_norm), delta=float(delta),
                       epsilon=rdp_epsilon(ledger.events, delta))
    return DpSgdResult(model, stats, ledger)
