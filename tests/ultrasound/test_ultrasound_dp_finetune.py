"""DP-SGD that keeps a pretrained network: BatchNorm frozen in eval form (timm's fused BatchNormAct2d too),
optionally only the last layer groups trained; ghost clipping and the plain step agree on such a model."""

from __future__ import annotations

import copy

import pytest
import timm
import torch
from timm.layers import BatchNormAct2d, FrozenBatchNormAct2d

from flower_apps.ultrasound.models import DP_FINETUNE, make_dp_model, model_skeleton
from flower_apps.ultrasound.train import DpSettings, train_local

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def lite0(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model("efficientnet_lite0", num_classes=2)
    with torch.no_grad():  # non-trivial statistics, as pretrained ones are
        for m in model.modules():
            if isinstance(m, BatchNormAct2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model


def data(n: int = 6, size: int = 32):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, size, size), generator=g, dtype=torch.uint8)
    return x, torch.randint(0, 2, (n,), generator=g)


def test_frozen_bn_keeps_statistics_and_mixes_no_examples():
    base = lite0()
    model, changes = make_dp_model(copy.deepcopy(base), "frozen-bn")
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert sum(isinstance(m, FrozenBatchNormAct2d) for m in model.modules()) == 49
    assert "49 x BatchNormAct2d" in changes[0].old and "Frozen" in changes[0].new
    torch.testing.assert_close(model.bn2.running_var, base.bn2.running_var)  # the (pretrained) statistics kept
    x = torch.randn(4, 3, 32, 32)
    model.train()
    alone = model(x[:1])
    together = model(x)[:1]
    torch.testing.assert_close(alone, together)  # training mode, yet example 0 ignores the others
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), base.eval()(x))  # = the original network in eval mode


def test_groupnorm_mode_is_what_it_was():
    model, changes = make_dp_model(lite0(), "groupnorm")
    assert any("GroupNormAct" in c.new for c in changes)
    with pytest.raises(ValueError, match="unknown DP fine-tuning mode"):
        make_dp_model(lite0(), "batchnorm")


@pytest.mark.parametrize("mode", ["frozen-bn", "frozen-bn-last", "frozen-bn-head"])
def test_huge_clip_no_noise_dp_step_equals_the_plain_step_on_the_frozen_model(mode):
    """Ghost clipping (the default) must skip the parameter-free frozen norms and get every other gradient right."""
    x, y = data()
    plain, _ = make_dp_model(lite0(), mode)
    private = copy.deepcopy(plain)
    kw = dict(epochs=1, batch_size=6, lr_for_epoch=lambda e: 1e-3, device=torch.device("cpu"), seed=0)
    train_local(plain, x, y, **kw)
    train_local(private, x, y, dp=DpSettings(0.0, 1e6, "ghost", poisson_sampling=False), **kw)
    start, _ = make_dp_model(lite0(), mode)
    changed = 0
    for (n, a), b, s in zip(plain.state_dict().items(), private.state_dict().values(), start.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=n)
        changed += int(not torch.equal(a, s))
    assert changed > 0
    for n, m in plain.named_modules():
        if isinstance(m, FrozenBatchNormAct2d):
            torch.testing.assert_close(m.running_var, dict(start.named_modules())[n].running_var)


def test_last_layers_mode_trains_only_the_last_groups():
    model, changes = make_dp_model(lite0(), "frozen-bn-last")
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    # timm's fine group_matcher for Lite0: ..., blocks.5.3, blocks.6.0 + conv_head, classifier
    assert trained and all(n.startswith(("blocks.5.3.", "blocks.6.", "conv_head.", "classifier.")) for n in trained)
    assert not any(n.startswith("blocks.5.2.") for n in trained)
    assert "classifier.weight" in trained and "conv_head.weight" in trained
    assert "last 3 layer groups" in changes[-1].new
    skeleton = model_skeleton("efficientnet_lite0", 2, 32, dp=True, dp_finetune="frozen-bn-last")
    assert {n for n, p in skeleton.named_parameters() if p.requires_grad} == trained  # clients build the same
    assert set(DP_FINETUNE) == {"groupnorm", "frozen-bn", "frozen-bn-last", "frozen-bn-head"}


def test_head_mode_is_a_linear_probe_of_the_frozen_features():
    model, changes = make_dp_model(lite0(), "frozen-bn-head")
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {"classifier.weight", "classifier.bias"}
    assert "last 1 layer groups" in changes[-1].new


def test_zero_head_init_starts_every_logit_at_zero_and_keeps_its_own_run_folder():
    from flower_apps.router import prepare
    from flower_apps.ultrasound.models import create_model

    zero, info = create_model("efficientnet_lite0", 2, 32, dp=True, pretrained=False, seed=3,
                              dp_finetune="frozen-bn-head", head_init="zero")
    timm_head, _ = create_model("efficientnet_lite0", 2, 32, dp=True, pretrained=False, seed=3,
                                dp_finetune="frozen-bn-head")
    assert info["head_init"] == "zero"
    assert not zero.classifier.weight.any() and not zero.classifier.bias.any()
    assert timm_head.classifier.weight.abs().mean() > 0.1  # timm: uniform in +-1/sqrt(2)
    assert not zero(torch.rand(2, 3, 32, 32)).any()  # all logits 0: both classes equally likely
    with pytest.raises(ValueError, match="unknown head init"):
        create_model("efficientnet_lite0", 2, 32, dp=False, pretrained=False, head_init="ones")
    base = {"study": "ultrasound", "preset": "smoke", "us-dp-sgd": True}
    plain = prepare(base)[1]
    other = prepare({**base, "us-head-init": "zero", "us-dp-finetune": "frozen-bn-head"})[1]
    assert other.default_run_name != plain.default_run_name
    assert "-frozen-bn-head_" in other.default_run_name and other.default_run_name.endswith("_head-zero")
    from flower_apps.common.results import run_identity

    assert "head_init" not in run_identity(plain) and run_identity(other)["head_init"] == "zero"
