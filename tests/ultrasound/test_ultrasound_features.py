"""Frozen-trunk features computed once (flower_apps/ultrasound/features.py): where they apply, and that DP-SGD
on the classifier over cached features is the same run as DP-SGD through the whole network."""

from __future__ import annotations

import copy
import warnings

import pytest
import timm
import torch

from datasets.transforms import ScannerProfile
from flower_apps.ultrasound import features
from flower_apps.ultrasound.models import make_dp_model
from flower_apps.ultrasound.train import DpSettings, predict_probs, train_local
from privacy.randomness import NoiseSource

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")
CPU = torch.device("cpu")


def lite0(mode: str = "frozen-bn-head", **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("efficientnet_lite0", num_classes=2, **kw)
    return make_dp_model(model, mode)[0] if mode else model


def images(n: int = 24, size: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, size, size), generator=g, dtype=torch.uint8), torch.randint(0, 2, (n,), generator=g)


@pytest.fixture(autouse=True)
def _empty_cache():
    features.clear_cache()
    yield
    features.clear_cache()


def test_the_head_is_used_only_when_it_alone_trains_on_a_deterministic_trunk():
    m = lite0()
    assert features.trainable_head(m) is m.get_classifier()
    assert features.trainable_head(lite0("frozen-bn")) is None  # every layer trains
    assert features.trainable_head(lite0("frozen-bn-last")) is None  # the last blocks train too
    assert features.trainable_head(lite0("groupnorm")) is None
    plain = lite0(None)  # BatchNorm with batch statistics in training, even with only the head trainable
    for n, p in plain.named_parameters():
        p.requires_grad_(n.startswith("classifier"))
    assert features.trainable_head(plain) is None
    assert features.trainable_head(lite0(drop_rate=0.2)) is None  # timm's head dropout
    assert features.trainable_head(lite0(drop_path_rate=0.1)) is None  # stochastic depth in the trunk
    # for evaluation only the frozen trunk matters: every layer is deterministic in eval mode
    assert features.frozen_trunk(plain) is plain.get_classifier()
    assert features.frozen_trunk(lite0("frozen-bn")) is None


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_dp_sgd_on_cached_features_is_the_same_run(mode, tmp_path):
    secret = tmp_path / "noise-seed"
    secret.write_text("a local secret")
    x, y = images()
    out, steps = {}, {}
    for cache in (False, True):
        m = lite0()
        with torch.no_grad():
            m.get_classifier().weight.normal_(0, 0.05)  # a head with an input gradient (timm's would do too)
        settings = DpSettings(1.0, 0.5, mode, noise=NoiseSource(str(secret)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stats = train_local(m, x, y, epochs=2, batch_size=6, lr_for_epoch=lambda e: 0.05, device=CPU, seed=3,
                                dp=settings, feature_cache=cache)
        out[cache] = copy.deepcopy(m.state_dict())
        steps[cache] = (stats.steps, stats.examples)
        assert stats.trunk_cached is cache  # what the run's summary reports (timing.trunk_cached_share)
    assert steps[True] == steps[False]
    moved = False
    for k, v in out[False].items():
        torch.testing.assert_close(out[True][k], v, rtol=1e-5, atol=1e-6, msg=k)
        moved |= not torch.equal(v, lite0().state_dict()[k])
    assert moved  # the runs trained (the classifier moved)
    assert any(len(e) for e in features._CACHE.values())


def test_evaluation_on_cached_features_gives_the_same_probabilities():
    m = lite0()
    with torch.no_grad():
        m.get_classifier().weight.normal_(0, 0.05)
    x, _ = images(10)
    plain = predict_probs(m, x, CPU, feature_cache=False)
    assert not features._CACHE
    cached = predict_probs(m, x, CPU)
    assert len(features._CACHE) == 1
    torch.testing.assert_close(torch.from_numpy(cached), torch.from_numpy(plain), rtol=1e-5, atol=1e-6)


def test_features_are_computed_once_per_trunk_and_images(monkeypatch):
    m = lite0()
    calls = []
    real = m.forward_features
    monkeypatch.setattr(m, "forward_features", lambda t: calls.append(len(t)) or real(t))
    x, _ = images(10)
    predict_probs(m, x, CPU)
    first = len(calls)
    assert first >= 2  # the check on a few images, then the images in batches
    predict_probs(m, x, CPU)
    assert len(calls) == first  # a hit: nothing recomputed
    with torch.no_grad():
        m.get_classifier().bias.add_(1.0)  # the classifier is not the trunk: still a hit
    predict_probs(m, x, CPU)
    assert len(calls) == first
    with torch.no_grad():
        next(p for n, p in m.named_parameters() if n.startswith("conv_stem")).mul_(1.01)  # a new trunk
    predict_probs(m, x, CPU)
    assert len(calls) > first
    predict_probs(m, images(10, seed=1)[0], CPU)  # other images
    assert len(features._CACHE) == 3


def test_a_trunk_that_is_random_in_training_is_not_cached(monkeypatch, tmp_path, caplog):
    """A stochastic layer the type checks cannot see (here: noise added in forward_features) is caught by
    the two-pass check, and the whole network trains at every step."""
    m = lite0()
    real = m.forward_features
    monkeypatch.setattr(m, "forward_features", lambda t: real(t) + 0.01 * torch.randn_like(real(t)))
    assert features.trainable_head(m) is m.get_classifier()
    secret = tmp_path / "noise-seed"
    secret.write_text("a local secret")
    x, y = images(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_local(m, x, y, epochs=1, batch_size=4, lr_for_epoch=lambda e: 0.05, device=CPU, seed=0,
                    dp=DpSettings(1.0, 0.5, noise=NoiseSource(str(secret))))
    assert not features._CACHE
    assert "two passes over the same images differ" in caplog.text


def test_augmented_images_are_never_cached(tmp_path):
    secret = tmp_path / "noise-seed"
    secret.write_text("a local secret")
    x, y = images(8)
    owners = torch.zeros(8, dtype=torch.long).numpy()
    skew = [ScannerProfile(brightness=(-0.1, 0.1), contrast=(1.0, 1.0), rotation_deg=0)]
    identity = [ScannerProfile(brightness=(0.0, 0.0), contrast=(1.0, 1.0), rotation_deg=0)]
    for profiles, cached in ((skew, False), (identity, True)):
        features.clear_cache()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stats = train_local(lite0(), x, y, epochs=1, batch_size=4, lr_for_epoch=lambda e: 0.05, device=CPU,
                                seed=0, dp=DpSettings(1.0, 0.5, noise=NoiseSource(str(secret))), owners=owners,
                                profiles=profiles)
        assert bool(features._CACHE) is cached and stats.trunk_cached is cached
