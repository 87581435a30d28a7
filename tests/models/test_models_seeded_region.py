"""models.seeded_init as the platform's one scoped seeding: the ultrasound builder, a CUDA device's generator."""

from __future__ import annotations

import pytest
import torch

from models.seeded_init import seeded_init


def test_ultrasound_builder_draws_the_old_weights_and_seeds_no_global_generator(monkeypatch):
    import timm

    from flower_apps.ultrasound.models import create_model

    with torch.random.fork_rng(devices=[]):  # the builder before: torch.manual_seed(seed) inside a CPU fork
        torch.manual_seed(3)
        old = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=2)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    monkeypatch.setattr(torch, "manual_seed", lambda *_: pytest.fail("torch.manual_seed called"))
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda *_: pytest.fail("CUDA generators reseeded"))
    new, _ = create_model("efficientnet_lite0", 2, 32, dp=False, pretrained=False, seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    ref = old.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in new.state_dict().items())
    other, _ = create_model("efficientnet_lite0", 2, 32, dp=False, pretrained=False, seed=4)
    assert not torch.equal(other.get_classifier().weight, new.get_classifier().weight)


def test_a_cpu_device_forks_only_the_cpu_generator():
    with seeded_init(5, device="cpu"):
        a = torch.rand(4)
    with seeded_init(5):
        b = torch.rand(4)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="from an int seed"):
        with seeded_init(torch.Generator().manual_seed(1), device="cuda:0"):
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_device_draws_as_after_torch_manual_seed_and_is_restored():
    dev = torch.device("cuda", torch.cuda.current_device())
    with torch.random.fork_rng(devices=[dev.index]):
        torch.manual_seed(7)
        old = torch.nn.functional.dropout(torch.ones(64, device=dev), 0.5)
    before = torch.cuda.get_rng_state(dev)
    with seeded_init(7, device=dev):
        new = torch.nn.functional.dropout(torch.ones(64, device=dev), 0.5)
    assert torch.equal(old, new)
    assert torch.equal(torch.cuda.get_rng_state(dev), before)
