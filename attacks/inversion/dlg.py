"""DLG and iDLG: Euclidean gradient matching with L-BFGS.

* ``dlg`` (Zhu et al. 2019, "Deep Leakage from Gradients"): a dummy image and a
  dummy soft label (softmax of free logits) are optimized jointly so that their
  gradient matches the observed one in squared Euclidean distance.
* ``idlg`` (Zhao et al. 2020): the label is read off the last-layer gradient
  (:mod:`attacks.inversion.labels`), then only the image is optimized.

One *iteration* is one L-BFGS iteration, run as a single ``LBFGS.step`` with
``max_iter = iterations``. With the default fixed step (no line search, as the
DLG reference code) that is exactly one objective evaluation per iteration;
with ``lbfgs_line_search="strong_wolfe"`` evaluations are capped at
``1.25 * iterations`` (PyTorch's ``max_eval``). Tolerances are set to 0, so a
restart stops early only at an exact stationary point, on a non-descent
direction (L-BFGS breakdown) or when the objective becomes non-finite; the
best finite evaluated iterate is kept in every case. Both attacks are
unconstrained, as published; metrics clip reconstructions to the pixel range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from attacks.inversion.labels import infer_label_from_gradient
from attacks.inversion.objectives import dummy_gradient, euclidean_distance
from attacks.inversion.registry import AttackContext, BestIterate, RestartOutcome, register_attack


class _Diverged(Exception):
    """Raised inside the closure to stop L-BFGS once the objective is non-finite."""


def lbfgs_minimize(
    ctx: AttackContext,
    leaves: Sequence[Tensor],
    objective: Callable[[], Tensor],
    image: Tensor,
    label_of_iterate: Callable[[], int],
) -> BestIterate:
    """Minimize ``objective()`` over ``leaves`` with L-BFGS, tracking the best evaluated ``image``."""
    cfg = ctx.config
    best = BestIterate()
    opt = torch.optim.LBFGS(
        list(leaves),
        lr=cfg.lbfgs_lr,
        max_iter=cfg.iterations,
        tolerance_grad=0.0,
        tolerance_change=0.0,
        history_size=cfg.lbfgs_history,
        line_search_fn=cfg.lbfgs_line_search,
    )

    def closure() -> Tensor:
        value = objective()
        # Gradients w.r.t. the dummy leaves only; model parameters get none.
        for leaf, g in zip(leaves, torch.autograd.grad(value, list(leaves))):
            leaf.grad = g
        v = float(value.detach())
        best.update(v, image, label_of_iterate())
        if not math.isfinite(v):
            raise _Diverged
        return value.detach()

    try:
        opt.step(closure)
    except _Diverged:
        pass
    return best


def _init_image(ctx: AttackContext, generator: torch.Generator) -> Tensor:
    x = torch.randn((1, *ctx.view.input_shape), generator=generator)
    return x.to(ctx.device).requires_grad_(True)


def known_or_inferred_label(ctx: AttackContext) -> int:
    """The view's label if the threat model grants it, else the iDLG inference."""
    if ctx.view.label is not None:
        return int(ctx.view.label)
    return infer_label_from_gradient(ctx.observed, ctx.view.num_classes)


@register_attack("dlg")
def dlg(ctx: AttackContext, generator: torch.Generator) -> RestartOutcome:
    """One DLG restart: joint L-BFGS over dummy image and dummy soft label."""
    x = _init_image(ctx, generator)
    y_logits = torch.randn((1, ctx.view.num_classes), generator=generator).to(ctx.device).requires_grad_(True)

    def objective() -> Tensor:
        dummy = dummy_gradient(ctx.model, ctx.params, x, F.softmax(y_logits, dim=-1))
        return euclidean_distance(dummy, ctx.observed)

    label = lambda: int(y_logits.detach().argmax())
    best = lbfgs_minimize(ctx, [x, y_logits], objective, x, label)
    return best.outcome(x, label())


@register_attack("idlg")
def idlg(ctx: AttackContext, generator: torch.Generator) -> RestartOutcome:
    """One iDLG restart: label from the last-layer gradient, L-BFGS over the image."""
    y = known_or_inferred_label(ctx)
    target = torch.tensor([y], dtype=torch.long, device=ctx.device)
    x = _init_image(ctx, generator)

    def objective() -> Tensor:
        return euclidean_distance(dummy_gradient(ctx.model, ctx.params, x, target), ctx.observed)

    best = lbfgs_minimize(ctx, [x], objective, x, lambda: y)
    return best.outcome(x, y)
