"""What a gradient-inversion adversary sees, and how that view is produced.

The threat model lives here (as in ``breaching``): an attack function receives an
:class:`AdversaryView` and nothing else. Two ways to build one:

* :func:`capture_single_example_gradient` + ``AdversaryView(...)``: the raw
  gradient of one example at the model state before the local update.
* :func:`view_from_noised_update`: the adversary observes the clipped and
  Gaussian-noised model update ``w_after - w_before`` of one local SGD step and
  treats ``-update / lr`` as the gradient (exact for one plain SGD step on one
  example without momentum or weight decay; otherwise an approximation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ModelFactory = Callable[[], nn.Module]
LossFn = Callable[[Tensor, Tensor], Tensor]


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` pairs with ``requires_grad``, in ``named_parameters`` order.

    This order defines the layout of every gradient / update list in this package.
    """
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def build_model(
    model_factory: ModelFactory, state_dict: Mapping[str, Tensor], device: str | torch.device = "cpu"
) -> nn.Module:
    """Instantiate ``model_factory()``, load ``state_dict`` and switch to eval mode.

    The factory runs under ``torch.random.fork_rng`` so that its random
    initialization (overwritten by ``state_dict`` anyway) leaves the caller's
    global RNG state untouched.
    """
    with torch.random.fork_rng(devices=[]):
        model = model_factory()
    if not isinstance(model, nn.Module):
        raise ValueError(f"model_factory must return a torch.nn.Module, got {type(model).__name__}")
    model.load_state_dict(dict(state_dict))
    return model.to(device).eval()


@dataclass(frozen=True)
class AdversaryView:
    """Everything a gradient-inversion adversary observes, and nothing more.

    Attributes
    ----------
    model_factory : callable
        ``() -> nn.Module`` building the architecture (white-box adversary).
    state_dict : mapping of str to Tensor
        The model state at which ``gradient`` was computed (copied on creation).
    gradient : tuple of Tensor
        One tensor per trainable parameter, in ``named_parameters`` order.
    input_shape : tuple of int
        Shape of one input without the batch dimension, e.g. ``(1, 28, 28)``.
    num_classes : int
        Number of classes of the classifier (>= 2).
    label : int or None
        The true label if the threat model grants it; ``None`` (default) means
        attacks that need a label infer it from the gradient.
    """

    model_factory: ModelFactory
    state_dict: Mapping[str, Tensor]
    gradient: tuple[Tensor, ...]
    input_shape: tuple[int, ...]
    num_classes: int
    label: int | None = field(default=None)

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.input_shape)
        if not shape or any(s < 1 for s in shape):
            raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got {self.input_shape}")
        object.__setattr__(self, "input_shape", shape)
        if int(self.num_classes) < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.label is not None and not 0 <= int(self.label) < self.num_classes:
            raise ValueError(f"label must be in [0, {self.num_classes}) or None, got {self.label}")
        if not callable(self.model_factory):
            raise ValueError("model_factory must be a callable returning an nn.Module")
        state = {k: v.detach().clone() for k, v in dict(self.state_dict).items()}
        object.__setattr__(self, "state_dict", state)
        grads = tuple(torch.as_tensor(g).detach().clone() for g in self.gradient)
        object.__setattr__(self, "gradient", grads)
        # Fail early on a gradient that does not fit the architecture.
        params = trainable_parameters(build_model(self.model_factory, state))
        if len(grads) != len(params):
            raise ValueError(f"gradient must have {len(params)} tensors (one per trainable parameter), got {len(grads)}")
        for g, (name, p) in zip(grads, params):
            if g.shape != p.shape:
                raise ValueError(f"gradient for parameter {name!r} must have shape {tuple(p.shape)}, got {tuple(g.shape)}")
            if not torch.all(torch.isfinite(g)):
                raise ValueError(f"gradient for parameter {name!r} must be finite")


def capture_single_example_gradient(
    model: nn.Module, x: Tensor, y: int | Tensor, loss_fn: LossFn = F.cross_entropy
) -> list[Tensor]:
    """Gradient of ``loss_fn(model(x), y)`` for one example, one tensor per trainable parameter.

    Call it at the model state *before* the local update. The model is put in
    **eval mode** for the call (and its mode restored): dropout is off and
    batch norm uses running statistics, so the gradient is deterministic and
    the attacker's model (also evaluated in eval mode) computes the same
    function. ``.grad`` fields are not touched (``torch.autograd.grad``).

    Parameters
    ----------
    model : torch.nn.Module
        The shared model.
    x : torch.Tensor
        One example with a batch dimension of 1, shape ``(1, *input_shape)``.
    y : int or torch.Tensor
        Its class index.
    loss_fn : callable, default ``torch.nn.functional.cross_entropy``
        ``(logits, target) -> scalar``. The attacks assume cross-entropy.

    Returns
    -------
    list of torch.Tensor
        Detached gradients in ``named_parameters`` order (trainable only).
    """
    if not isinstance(x, Tensor) or x.ndim < 2 or x.shape[0] != 1:
        raise ValueError(f"x must be a tensor of shape (1, *input_shape), got {getattr(x, 'shape', type(x))}")
    params = [p for _, p in trainable_parameters(model)]
    if not params:
        raise ValueError("model must have at least one trainable parameter")
    device = params[0].device
    target = torch.as_tensor(y, dtype=torch.long, device=device).reshape(1)
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            loss = loss_fn(model(x.to(device)), target)
            grads = torch.autograd.grad(loss, params)
    finally:
        model.train(was_training)
    return [g.detach().clone() for g in grads]


def update_from_states(
    model_factory: ModelFactory, state_before: Mapping[str, Tensor], state_after: Mapping[str, Tensor]
) -> list[Tensor]:
    """Model update ``w_after - w_before`` per trainable parameter (buffers are ignored)."""
    names = [n for n, _ in trainable_parameters(build_model(model_factory, state_before))]
    for label, state in (("state_before", state_before), ("state_after", state_after)):
        missing = [n for n in names if n not in state]
        if missing:
            raise ValueError(f"{label} lacks parameters {missing}")
    return [(state_after[n].detach() - state_before[n].detach()).clone() for n in names]


def view_from_noised_update(
    model_factory: ModelFactory,
    state_before: Mapping[str, Tensor],
    update: Sequence[Tensor],
    *,
    lr: float,
    clip_norm: float | None,
    sigma: float,
    generator: torch.Generator,
    input_shape: tuple[int, ...],
    num_classes: int,
    label: int | None = None,
) -> AdversaryView:
    """Adversary view of a clipped and noised update instead of the raw gradient.

    The released update is ``u' = u * min(1, C / ||u||_2) + N(0, sigma^2 I)``
    (clipping over all parameters as one vector, as in DP-SGD / the seed
    paper's Algorithm 1), with noise drawn from ``generator``. The adversary
    then assumes ``u = -lr * grad`` (one plain SGD step on one example) and
    matches against ``-u' / lr``. Clipping rescales that estimate by an unknown
    factor: cosine matching (``invgrad``) is invariant to it, Euclidean
    matching (``dlg``, ``idlg``) is not.

    Parameters
    ----------
    model_factory, state_before
        Architecture and the state before the local step.
    update : sequence of Tensor
        ``w_after - w_before`` per trainable parameter (see :func:`update_from_states`).
    lr : float
        Local learning rate (> 0), known to the adversary.
    clip_norm : float or None
        L2 clipping bound ``C`` (> 0); ``None`` disables clipping.
    sigma : float
        Absolute noise SD per coordinate (>= 0), ``sigma_abs`` in the seed paper.
    generator : torch.Generator
        CPU generator for the noise.
    input_shape, num_classes, label
        As in :class:`AdversaryView`.
    """
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}")
    if not sigma >= 0 or not math.isfinite(sigma):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    u = [torch.as_tensor(t).detach().cpu().double() for t in update]
    if not u:
        raise ValueError("update must contain one tensor per trainable parameter, got none")
    norm = math.sqrt(sum(float(t.pow(2).sum()) for t in u))
    scale = 1.0 if clip_norm is None or norm <= clip_norm else clip_norm / norm
    released = [t * scale + sigma * torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in u]
    dtypes = [torch.as_tensor(t).dtype for t in update]
    gradient = tuple((-r / lr).to(d) for r, d in zip(released, dtypes))
    return AdversaryView(model_factory, state_before, gradient, tuple(input_shape), num_classes, label)
