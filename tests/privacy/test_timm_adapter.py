"""privacy/dpsgd/timm_adapter.py: a ViT made Opacus-compatible is the same live object, of timm's class, and
computes what the stock model computes, bit for bit (eval, train with seeded dropout, gradients)."""

from __future__ import annotations

import copy

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from privacy.dpsgd import make_opacus_compatible
from privacy.dpsgd.timm_adapter import TokenEmbedHook


def _vit(**kw) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_224", img_size=32, depth=2, num_classes=3, **kw)


X = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
Y = torch.tensor([0, 2, 1, 0])


@pytest.mark.parametrize("kw", [{}, {"pos_drop_rate": 0.2, "drop_rate": 0.1, "proj_drop_rate": 0.1}])
def test_the_fixed_vit_computes_what_the_stock_vit_computes_bit_for_bit(kw):
    stock = _vit(**kw)
    fixed, changes = make_opacus_compatible(copy.deepcopy(stock))
    assert any("token_embed" in c.new for c in changes)
    with torch.no_grad():
        assert torch.equal(fixed.eval()(X), stock.eval()(X))
    stock.train()
    fixed.train()
    outs, grads = [], []
    for model in (stock, fixed):
        torch.manual_seed(7)  # the same dropout masks, drawn in the same order
        model.zero_grad()
        out = model(X)
        nn.functional.cross_entropy(out, Y).backward()
        outs.append(out.detach())
        grads.append({n.removeprefix("token_embed."): p.grad for n, p in model.named_parameters()})
    assert torch.equal(outs[0], outs[1])
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert torch.equal(g, grads[1][name]), name


def test_no_class_is_swapped_and_the_parameter_order_is_the_old_one():
    vit = _vit()
    names = [n for n, _ in vit.named_parameters()]
    fixed, _ = make_opacus_compatible(vit)
    assert type(fixed) is VisionTransformer  # timm's own class: nothing subclassed or swapped
    assert fixed.cls_token is None and fixed.pos_embed is None
    # the layout the DP optimizer's per-parameter noise stream was drawn in before (token_embed registered last)
    assert [n for n, _ in fixed.named_parameters()] == [n for n in names if n not in ("cls_token", "pos_embed")] + [
        "token_embed.cls_token", "token_embed.pos_embed"]
    hooks = list(fixed.patch_embed._forward_hooks.values())
    assert len(hooks) == 1 and isinstance(hooks[0], TokenEmbedHook) and hooks[0].token_embed is fixed.token_embed


def test_a_deep_copy_calls_its_own_token_embed():
    fixed, _ = make_opacus_compatible(_vit())
    twin = copy.deepcopy(fixed)
    hook = next(iter(twin.patch_embed._forward_hooks.values()))
    assert hook.token_embed is twin.token_embed and hook.pos_drop is twin.pos_drop
    with torch.no_grad():
        before = fixed.eval()(X)
        twin.token_embed.pos_embed.add_(1.0)
        assert torch.equal(fixed(X), before)  # the original does not read the copy's tables
        assert not torch.equal(twin.eval()(X), before)


def test_without_the_hook_the_model_would_drop_its_tokens():
    """The hook is what adds the class token: removed, the sequence is one token shorter (the test can fail)."""
    fixed, _ = make_opacus_compatible(_vit())
    seen = []
    fixed.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    with torch.no_grad():
        fixed.eval()(X)
        fixed.patch_embed._forward_hooks.clear()
        fixed(X)
    assert seen == [5, 4]  # (32 / 16)^2 patches + the class token, then the patches alone
