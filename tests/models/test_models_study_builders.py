"""The studies' own model builders: same initial weights as before seeded_init, global RNG untouched."""

import hashlib

import numpy as np
import pytest
import torch


def _tabular(seed):
    from flower_apps.tabular_pdp.model import build_model

    return build_model(seed, 5)


def _lenet5(seed):
    from flower_apps.unlinkable_dfl.models import build_model

    return build_model("lenet5", seed)


def _example(seed):
    from flower_apps.example_minimal import model_for

    return model_for(type("Cfg", (), {"seed": seed})(), torch.zeros(4, 64))


def _digest(model: torch.nn.Module) -> str:
    flat = torch.cat([v.detach().reshape(-1).double() for v in model.state_dict().values()]).numpy()
    a = np.ascontiguousarray(flat)
    return hashlib.sha256(a.tobytes() + str(a.dtype).encode() + str(a.shape).encode()).hexdigest()[:20]


# Produced by the builders with torch.manual_seed inside, at c490f13 (before models.seeded_init).
BUILDERS = [
    (_tabular, 0, "9993877579f6f2aca9bf"),
    (_lenet5, 0, "0c7b8a8e2e555cca57d6"),
    (_example, 0, "79cbfdb25cdff866999e"),
    (_example, 5, "50b975deb12f8861e66a"),
]


@pytest.mark.parametrize("build, seed, digest", BUILDERS)
def test_same_weights_as_before_and_global_rng_untouched(monkeypatch, build, seed, digest):
    torch.manual_seed(99)
    before = torch.get_rng_state()
    monkeypatch.setattr(torch, "manual_seed", lambda *_: pytest.fail("torch.manual_seed called"))
    assert _digest(build(seed)) == digest
    assert torch.equal(torch.get_rng_state(), before)
