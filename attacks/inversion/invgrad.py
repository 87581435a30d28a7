"""Inverting Gradients (Geiping et al. 2020): cosine matching + total variation, Adam.

Objective: ``1 - cos(g', g) + tv_weight * TV(x)`` with all parameters' gradients
as one vector. The label is taken from the view if granted, else inferred as in
iDLG. Optimizer: Adam on the *sign* of the input gradient (the reference
implementation's ``signed=True``; ``InversionConfig.signed_gradients=False``
gives plain Adam), step size decayed x0.1 at 3/8, 5/8 and 7/8 of the
iterations, and after every step the image is projected onto the box
``InversionConfig.pixel_bounds`` (the valid range of normalized pixels).
Exactly one objective evaluation per iteration; a restart stops early only
when the objective becomes non-finite.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attacks.inversion.dlg import known_or_inferred_label
from attacks.inversion.objectives import cosine_distance, dummy_gradient, total_variation
from attacks.inversion.registry import AttackContext, BestIterate, RestartOutcome, register_attack


def _project(x: Tensor, box: tuple[Tensor, Tensor] | None) -> None:
    if box is not None:
        with torch.no_grad():
            x.copy_(torch.maximum(torch.minimum(x, box[1]), box[0]))


@register_attack("invgrad")
def invgrad(ctx: AttackContext, generator: torch.Generator) -> RestartOutcome:
    """One Inverting-Gradients restart."""
    cfg = ctx.config
    y = known_or_inferred_label(ctx)
    target = torch.tensor([y], dtype=torch.long, device=ctx.device)
    box = ctx.pixel_box()
    x = torch.randn((1, *ctx.view.input_shape), generator=generator).to(ctx.device)
    _project(x, box)
    x.requires_grad_(True)
    observed_norm = torch.sqrt(sum(o.pow(2).sum() for o in ctx.observed))  # type: ignore[arg-type]
    opt = torch.optim.Adam([x], lr=cfg.adam_lr)
    n = cfg.iterations
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[n * 3 // 8, n * 5 // 8, n * 7 // 8], gamma=0.1)
    best = BestIterate()
    for _ in range(n):
        dummy = dummy_gradient(ctx.model, ctx.params, x, target)
        value = cosine_distance(dummy, ctx.observed, observed_norm) + cfg.tv_weight * total_variation(x)
        (grad,) = torch.autograd.grad(value, [x])
        v = float(value.detach())
        best.update(v, x, y)
        if not math.isfinite(v):
            break
        x.grad = grad.sign() if cfg.signed_gradients else grad
        opt.step()
        sched.step()
        _project(x, box)
    return best.outcome(x, y)
