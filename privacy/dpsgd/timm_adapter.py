"""The one place privacy.dpsgd relies on how timm's VisionTransformer works inside, gated on timm >=1.0,<2.

:func:`privacy.dpsgd.compat.make_opacus_compatible` moves a ViT's ``cls_token`` / ``pos_embed`` into a
leaf module (``token_embed``, a :class:`~privacy.dpsgd.compat.PrefixTokenPosEmbed`) so that Opacus does
not re-run the whole network per sample for parameters of the root. The model must then call that leaf
where timm adds the tokens. It stays the live object it was, of timm's own class: nothing subclasses
it or swaps its ``__class__`` (the old ``DpVisionTransformer`` did, to override ``_pos_embed``). Instead
:func:`route_tokens_through` registers a forward hook (torch's public hook API) on ``patch_embed``
whose output then goes through ``token_embed`` and ``pos_drop``, the steps of timm's default
``_pos_embed`` for a class token inside the position table.

What that relies on in timm (-> the upstream public alternative, if any):

* ``VisionTransformer.forward_features`` (and ``forward_intermediates``) call ``patch_embed`` and then the
  private ``_pos_embed`` on its output; with ``cls_token``, ``reg_token`` and ``pos_embed`` all None,
  ``_pos_embed`` returns its input's values unchanged (``torch.cat`` of the one token tensor), so the hook's
  ``pos_drop(token_embed(x))`` is exactly timm's ``pos_drop(cat([cls, x]) + pos_embed)``
  (-> none: timm has no public hook for the token / position step; overriding the public
  ``forward_features`` would copy more of timm).

:data:`TIMM` is the tested range (pyproject.toml's pin); :func:`route_tokens_through` raises on another
version. tests/privacy/test_timm_adapter.py checks the fixed model against the stock one (outputs in eval
and in train mode with seeded dropout, gradients, parameter order, deep copies).
"""

from __future__ import annotations

import torch
from torch import nn

from registry.third_party import VersionGate

TIMM = VersionGate("timm", ">=1.0,<2", adapter="privacy/dpsgd/timm_adapter.py",
                   tests="tests/privacy/test_timm_adapter.py")


class TokenEmbedHook:
    """Forward hook on a timm ViT's ``patch_embed``: its (B, N, D) tokens go through ``token_embed`` and ``pos_drop``.

    It holds the two modules (children of the same ViT), not the ViT, so the model has no reference
    cycle; ``copy.deepcopy`` of the ViT copies the hook with the copies of those modules.
    """

    def __init__(self, token_embed: nn.Module, pos_drop: nn.Module) -> None:
        self.token_embed = token_embed
        self.pos_drop = pos_drop

    def __call__(self, _module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        return self.pos_drop(self.token_embed(output.view(output.shape[0], -1, output.shape[-1])))


def route_tokens_through(vit: nn.Module, token_embed: nn.Module) -> None:
    """Make ``vit`` (a timm VisionTransformer whose ``cls_token`` / ``pos_embed`` are now None) add its class
    token and position embedding with ``token_embed``, registered as its child of that name (last, so the
    parameter order is the one the DP optimizer's noise stream was drawn in before)."""
    TIMM.require("privacy.dpsgd.compat (a ViT's class token and position embedding as a leaf module)")
    if vit.cls_token is not None or vit.pos_embed is not None or vit.reg_token is not None:
        raise ValueError("route_tokens_through: the ViT must hold no cls_token, reg_token or pos_embed of its own")
    vit.token_embed = token_embed
    vit.patch_embed.register_forward_hook(TokenEmbedHook(token_embed, vit.pos_drop))
