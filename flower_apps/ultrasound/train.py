"""Local training of the ultrasound study: Adam, step-decay schedule, FedProx term, DP-SGD (Opacus).

Paper recipe: Adam (lr 1e-3) decayed x0.1 at 50% and 80% of the rounds, batch 32, 5 local
epochs. FedProx adds mu/2 ||w - w_t||^2 to the client loss. Under DP-SGD the data loss's
per-sample gradients are clipped to C and noised (Opacus); the proximal gradient
mu (w - w_t) depends on no data, so it is added *after* privatization (post-processing,
no privacy cost) -- adding it to the loss would let Opacus overwrite it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from datasets.transforms import ScannerProfile, to_model_input, uint8_to_unit
from flower_apps.ultrasound.features import cached_features, frozen_trunk, trainable_head
from flower_apps.ultrasound.metrics import classification_metrics
from privacy.dpsgd import GradientCanaries, ghost_clipping_backward, ghost_targets, make_private, unwrap
from privacy.dpsgd.engine import DPOptimizerLike
from privacy.randomness import NoiseSource
from registry import streams

LR_MILESTONES = (0.5, 0.8)  # fractions of the rounds after which the lr is multiplied by LR_DECAY
LR_DECAY = 0.1


@dataclass(frozen=True)
class DpSettings:
    """Client-side DP-SGD: per-sample clip norm C, noise multiplier, Opacus grad-sample mode."""

    noise_multiplier: float
    max_grad_norm: float
    grad_sample_mode: str = "ghost"
    poisson_sampling: bool = True  # False only in tests (fixed batches, to compare with a plain step)
    noise: NoiseSource = field(default_factory=NoiseSource)  # secret by default (privacy.randomness)
    # issue 37, tests only (privacy/faults.py, run key dp-fault): the optimizer's noise multiplier is divided by
    # this, while the ledger and every reported value keep noise_multiplier (a bug does not announce itself)
    noise_divisor: float = 1.0


@dataclass
class TrainStats:
    """What one call of :func:`train_local` did."""

    loss: float
    examples: int
    steps: int
    seconds: float
    sample_rate: float | None  # DP-SGD Poisson rate q (None without DP)
    trunk_cached: bool = False  # the classifier trained on trunk features computed once (features.py)

    @property
    def step_seconds(self) -> float:
        return self.seconds / max(self.steps, 1)


def lr_at_round(base_lr: float, server_round: int, num_rounds: int) -> float:
    """lr for 1-based ``server_round`` of ``num_rounds``: x0.1 after 50% and again after 80% of the rounds."""
    if server_round < 1:
        raise ValueError(f"server_round must be >= 1, got {server_round}")
    return base_lr * LR_DECAY ** sum(server_round > m * num_rounds for m in LR_MILESTONES)


def proximal_term(params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor]) -> torch.Tensor:
    """||w - w_t||^2 summed over all trainable tensors (FedProx, Li et al. 2020, Eq. 2 without mu/2)."""
    return cast(torch.Tensor, sum(((p - a) ** 2).sum() for p, a in zip(params, anchor, strict=True)))  # >= 1 tensor


def _is_identity(prof: ScannerProfile) -> bool:
    return prof.brightness == (0.0, 0.0) and prof.contrast == (1.0, 1.0) and prof.rotation_deg == 0


def _augments(owners: np.ndarray | None, profiles: list[ScannerProfile] | None) -> bool:
    """Whether :func:`model_input` would transform any of these images (a non-identity scanner profile)."""
    if profiles is None or owners is None:
        return False
    return not all(_is_identity(profiles[int(k)]) for k in np.unique(owners))


def model_input(x_u8: torch.Tensor, owners: np.ndarray | None, profiles: list[ScannerProfile] | None,
                generator: torch.Generator | None, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """uint8 (n, S, S) -> feature-skew augmentation (per owner's profile, if any) -> normalized (n, 3, S, S),
    in channels-last layout when asked (the model must be too: :func:`train_local`)."""
    x = uint8_to_unit(x_u8.to(device)).unsqueeze(1)
    if profiles is not None and owners is not None and generator is not None:
        for k in np.unique(owners):
            prof = profiles[int(k)]
            if _is_identity(prof):
                continue
            sel = torch.from_numpy(np.flatnonzero(owners == k)).to(device)
            x[sel] = prof.apply(x[sel], generator)
    x = to_model_input(x)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _plain_batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled batches; a trailing batch of one sample joins the previous one (BatchNorm needs > 1)."""
    order = torch.randperm(n, generator=generator)
    batches = list(order.split(batch_size))
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2] = torch.cat([batches[-2], batches.pop()])
    return batches


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr_for_epoch: Callable[[int], float],
    device: torch.device,
    seed: int,
    proximal_mu: float = 0.0,
    dp: DpSettings | None = None,
    owners: np.ndarray | None = None,
    profiles: list[ScannerProfile] | None = None,
    on_epoch_end: Callable[[int, nn.Module], None] | None = None,
    channels_last: bool = False,
    feature_cache: bool = True,
    gradient_canaries: GradientCanaries | None = None,
) -> TrainStats:
    """Train ``model`` in place for ``epochs`` epochs on uint8 images ``x`` and labels ``y``.

    ``lr_for_epoch(e)`` gives the lr of 1-based epoch e; ``owners``/``profiles`` select each
    image's feature-skew augmentation; ``on_epoch_end(e, model)`` is called after each epoch
    (the unwrapped model). With ``dp``, one epoch is 1/q Poisson-sampled steps (Opacus).
    ``channels_last``: convolution weights and inputs in channels-last layout while training (same
    mathematics, faster oneDNN kernels on CPU); the model is returned in the default layout. Without
    DP-SGD only: Opacus' (1.6) per-sample convolution gradients are wrong for channels-last inputs
    (measured: per-example gradients off by as much as their size, while their batch sum stays
    right), so DP-SGD always trains in the default layout.
    ``feature_cache``: under DP-SGD, when only the classifier trains on a deterministic frozen trunk and no
    image is augmented, train the classifier on the trunk's features computed once
    (:mod:`flower_apps.ultrasound.features`: same mathematics, other float rounding).
    ``gradient_canaries`` (with ``dp`` only): an auditor's white-box gradient canaries in every DP-SGD step
    (:mod:`privacy.dpsgd.canaries`); they record what they observe.
    """
    n = len(y)
    if gradient_canaries is not None and dp is None:
        raise ValueError("gradient canaries live in the DP-SGD optimizer's step: they need dp")
    if n == 0:
        raise ValueError("cannot train on an empty client dataset")
    model.to(device).train()
    channels_last = channels_last and dp is None  # see the docstring: Opacus needs the default layout
    if channels_last:
        model.to(memory_format=torch.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    anchor = [p.detach().clone() for p in params] if proximal_mu > 0 else None
    # DP-SGD on the classifier of a frozen trunk: the trunk's features of each image, computed once
    trained: nn.Module = model
    feats = None
    head = trainable_head(model) if feature_cache and dp is not None and not _augments(owners, profiles) else None
    if head is not None:
        feats = cached_features(model, head, x, lambda xb: model_input(xb, None, None, None, device))
        if feats is not None:
            trained = head
    opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=lr_for_epoch(1))
    g_data = streams.torch_generator("ultrasound.batches", seed)
    g_aug = streams.torch_generator("ultrasound.augmentation", seed)
    loss_fn: nn.Module = nn.CrossEntropyLoss()
    net: nn.Module = model
    pt = None
    if dp is not None:
        if not dp.noise_divisor > 0:
            raise ValueError(f"noise_divisor must be > 0, got {dp.noise_divisor}")
        pt = make_private(trained, opt, n, batch_size, noise_multiplier=dp.noise_multiplier / dp.noise_divisor,
                          max_grad_norm=dp.max_grad_norm, grad_sample_mode=dp.grad_sample_mode, seed=seed,
                          poisson_sampling=dp.poisson_sampling, noise=dp.noise, gradient_canaries=gradient_canaries)
        net, opt, loss_fn = pt.model, pt.optimizer, pt.criterion
    total, seen, steps = 0.0, 0, 0
    t0 = time.perf_counter()
    for epoch in range(1, epochs + 1):
        for group in opt.param_groups:
            group["lr"] = lr_for_epoch(epoch)
        batches = [b[0] for b in pt.loader] if pt is not None else _plain_batches(n, batch_size, g_data)
        for idx in batches:
            steps += 1
            if len(idx) == 0:  # Poisson sampling can draw an empty batch; Opacus would release pure noise
                continue
            if feats is not None:
                xb = feats[idx]
            else:
                xb = model_input(x[idx], None if owners is None else owners[idx.numpy()], profiles, g_aug, device,
                                 channels_last)
            yb = y[idx].to(device)
            opt.zero_grad(set_to_none=True)
            if pt is None:
                loss = loss_fn(net(xb), yb)
                obj = loss + (proximal_mu / 2) * proximal_term(params, anchor) if anchor is not None else loss
                obj.backward()
                opt.step()
            else:
                with warnings.catch_warnings():  # Opacus' hooks on the first layer: benign, inputs need no grad
                    warnings.filterwarnings("ignore", message="Full backward hook is firing")
                    assert dp is not None  # pt is made only under DP (above)
                    if dp.grad_sample_mode == "ghost":
                        targets = ghost_targets(net, xb)  # the batch, or the trainable params after a frozen prefix
                        losses = nn.functional.cross_entropy(net(xb), yb, reduction="none")
                        ghost_clipping_backward(net, losses, targets)
                        loss = losses.detach().mean()
                    else:
                        loss = loss_fn(net(xb), yb)
                        loss.backward()
                dp_opt = cast(DPOptimizerLike, opt)  # Opacus' DP optimizer (make_private)
                if dp_opt.pre_step():  # clip per-sample gradients, add noise, average
                    if anchor is not None:
                        with torch.no_grad():
                            for p, a in zip(params, anchor):
                                cast(torch.Tensor, p.grad).add_(p.detach() - a, alpha=proximal_mu)  # pre_step set it
                    dp_opt.original_optimizer.step()
            total += float(loss.detach().item()) * len(idx)
            seen += len(idx)
        if on_epoch_end is not None:
            on_epoch_end(epoch, model)
            model.train()
    if channels_last:
        model.to(memory_format=torch.contiguous_format)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    if pt is not None:
        cast(Any, pt.model).cleanup()  # remove Opacus hooks so the module can be reused (public; Opacus' _close calls it)
    return TrainStats(total / max(seen, 1), seen, steps, seconds, pt.sample_rate if pt is not None else None,
                      trunk_cached=feats is not None)


@torch.no_grad()
def predict_probs(model: nn.Module, x: torch.Tensor, device: torch.device, batch_size: int = 256,
                  feature_cache: bool = True) -> np.ndarray:
    """Softmax class probabilities (n, C) for uint8 images ``x`` (no augmentation).

    ``feature_cache``: when only the classifier can train (a frozen trunk), the trunk's features of ``x``
    are computed once per trunk (:mod:`flower_apps.ultrasound.features`), e.g. for the server's
    per-round evaluation of a DP linear probe.
    """
    model = unwrap(model).to(device).eval()
    head = frozen_trunk(model) if feature_cache and len(x) else None
    if head is not None:
        feats = cached_features(model, head, x, lambda xb: model_input(xb, None, None, None, device))
        if feats is not None:
            return torch.softmax(head(feats).float(), 1).cpu().numpy()
    out = []
    for s in range(0, len(x), batch_size):
        out.append(torch.softmax(model(model_input(x[s : s + batch_size], None, None, None, device)).float(), 1).cpu())
    return torch.cat(out).numpy() if out else np.zeros((0, 1))


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> dict:
    """:func:`flower_apps.ultrasound.metrics.classification_metrics` of ``model`` on (x, y)."""
    return classification_metrics(y.numpy(), predict_probs(model, x, device))


def client_seed(seed: int, server_round: int, client_id: int) -> int:
    """The seed of (run seed, round, client) for batches, augmentation and DP noise.

    Reduced mod 2**62 (the shared derivation leaves it unreduced): the published runs used this seed.
    """
    return streams.seed_int("ultrasound.client", seed, server_round, client_id)
