"""Frozen-trunk features, computed once: DP-SGD on the classifier of a frozen backbone (``frozen-bn-head``).

When only a timm model's classifier trains, everything before it (the *trunk*: ``forward_features`` and
the pooling of ``forward_head(pre_logits=True)``) is a fixed function of the image: its weights never
change (no client trains them, so FedAvg / FedProx / FedAdam hand them back unchanged), its BatchNorm is
frozen, and with no dropout, no stochastic depth and no per-batch augmentation nothing random happens in
it. The classifier's per-example gradients, their clipping and the DP noise then depend on the trunk only
through those features, so training the classifier on features computed once is the same mathematics as
running the whole network at every step (the `cpu` grid's DP runs: ~15 min -> ~1 min on 2 cores).
What differs is float rounding: the features of an image are computed in other batches than the DP
batches (oneDNN's summation order may depend on the batch), so a run agrees with the uncached one to
about 1e-6, not bit for bit (``tests/ultrasound/test_ultrasound_features.py``).

Where it applies is decided per call, never assumed: :func:`trainable_head` returns the classifier only
when exactly its parameters train and no module of the trunk behaves differently in training (BatchNorm
with batch statistics, dropout, drop-path, timm's head dropout); :func:`cached_features` then checks on a
few images that two trunk passes agree and that ``classifier(features)`` is the model's output, and
returns None (the caller runs the whole network) when either fails. Features are kept per process in a
small LRU keyed by the trunk's weights, the images and the mode, so a new global trunk is a new entry.

Privacy: the cache is local to the process that trains (a client's ClientApp, the centralized baseline)
and holds what the trunk computes from that party's own images; nothing of it leaves in a message.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import nn

from flower_apps.ultrasound.pretrained import timm_view

log = logging.getLogger(__name__)

CACHE_ENTRIES = 48  # (trunk, images, mode) entries per process: 8 clients' train sets + val + test, with room
CHECK_IMAGES = 8  # images of the determinism / split check on each cache miss
_CACHE: OrderedDict[tuple, torch.Tensor] = OrderedDict()


def _stochastic_in_training(module: nn.Module) -> str | None:
    """Why ``module`` computes differently in training mode (None: it does not, as far as its type tells)."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return f"{type(module).__name__} normalises with batch statistics in training"
    if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
        return f"{type(module).__name__}(p={module.p})"
    if float(getattr(module, "drop_prob", 0.0) or 0.0) > 0:  # timm DropPath / DropBlock
        return f"{type(module).__name__}(drop_prob={module.drop_prob})"
    return None


def _classifier(model: nn.Module) -> tuple[nn.Module, set[int]] | None:
    """A timm model's classifier and the ids of its parameters (None: no split into trunk and classifier)."""
    if not all(hasattr(model, a) for a in ("get_classifier", "forward_features", "forward_head")):
        return None
    head = timm_view(model).get_classifier()
    if not isinstance(head, nn.Module):
        return None
    head_params = {id(p) for p in head.parameters()}
    return (head, head_params) if head_params else None


def trainable_head(model: nn.Module) -> nn.Module | None:
    """``model``'s classifier when it holds exactly the trainable parameters and the trunk before it computes
    the same in training as in evaluation; else None (the whole network must run at every step)."""
    found = _classifier(model)
    if found is None or {id(p) for p in model.parameters() if p.requires_grad} != found[1]:
        return None
    head = found[0]
    if float(getattr(model, "drop_rate", 0.0) or 0.0) > 0:  # timm applies it functionally in forward_head
        return None
    in_head = {id(m) for m in head.modules()}
    if any(_stochastic_in_training(m) for m in model.modules() if id(m) not in in_head):
        return None
    return head


def frozen_trunk(model: nn.Module) -> nn.Module | None:
    """``model``'s classifier when no parameter outside it trains (for evaluation, where every layer is
    deterministic); else None."""
    found = _classifier(model)
    if found is None or any(p.requires_grad for p in model.parameters() if id(p) not in found[1]):
        return None
    return found[0]


def _trunk(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    timm_model = timm_view(model)
    return timm_model.forward_head(timm_model.forward_features(x), pre_logits=True)


def _digest(model: nn.Module, head: nn.Module, images: torch.Tensor) -> str:
    h = hashlib.blake2b(digest_size=20)
    head_tensors = {id(t) for t in list(head.parameters()) + list(head.buffers())}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if id(t) in head_tensors:
            continue
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    h.update(str((tuple(images.shape), images.dtype)).encode())
    h.update(images.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def cached_features(model: nn.Module, head: nn.Module, images: torch.Tensor,
                    prepare: Callable[[torch.Tensor], torch.Tensor], batch_size: int = 64) -> torch.Tensor | None:
    """The trunk's features of ``images`` (uint8, as stored) in ``model``'s current mode, computed once per
    (trunk weights, images, mode) in this process; None when the check on the first images fails.

    ``prepare`` turns a uint8 batch into the model's input (no augmentation).
    """
    key = (_digest(model, head, images), bool(model.training), str(next(model.parameters()).device))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    probe = prepare(images[:CHECK_IMAGES])
    first = _trunk(model, probe)
    if not torch.equal(first, _trunk(model, probe)):
        log.warning("frozen-trunk features: two passes over the same images differ; training the whole network")
        return None
    if not torch.allclose(head(first), model(probe), rtol=1e-4, atol=1e-5):
        log.warning("frozen-trunk features: classifier(features) is not the model's output for %s; "
                    "training the whole network", type(model).__name__)
        return None
    feats = torch.cat([_trunk(model, prepare(images[s : s + batch_size])) for s in range(0, len(images), batch_size)])
    _CACHE[key] = feats
    while len(_CACHE) > CACHE_ENTRIES:
        _CACHE.popitem(last=False)
    return feats


def clear_cache() -> None:
    """Drop every cached feature (tests; a process that wants its memory back)."""
    _CACHE.clear()
