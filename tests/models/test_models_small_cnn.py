"""models: the small CNN's initial weights (golden, from before the move) and the untouched global RNG."""

import hashlib

import numpy as np
import pytest
import torch

from models.seeded_init import seeded_init
from models.small_cnn import SmallCNN, build_small_cnn


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().astype(np.float32).tobytes())
    return h.hexdigest()


# Produced by flower_apps/dfl_dp/model.py build_model (torch.manual_seed inside) at c490f13, before the move.
GOLDEN = [
    ((0,), "e0215c396b5c560e3e9c6fe6818cdee3d676d87d132a26921dfb5ce94809daee"),
    ((1, 1, 4, 8), "b3571e4c6ccb9a21c4627104745188325ba00495ac7636667714985abcd98acf"),
    ((3, 3, 10, 32), "7378975fc04cd7291d542be78b037216239d61876f606d5b82788e2db2cc0324"),
]


@pytest.mark.parametrize("args, digest", GOLDEN)
def test_initial_weights_match_the_dfl_dp_builder_before_the_move(args, digest):
    assert _digest(build_small_cnn(*args)) == digest


def test_first_weights_by_hand():
    w = build_small_cnn(0).features[0].weight.flatten()[:3].tolist()
    assert w == [-0.0024956068955361843, 0.17881453037261963, -0.2743483781814575]


def test_builder_is_deterministic_and_seed_dependent():
    assert _digest(build_small_cnn(5)) == _digest(build_small_cnn(5))
    assert _digest(build_small_cnn(5)) != _digest(build_small_cnn(6))


def test_builder_leaves_the_global_generators_alone(monkeypatch):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    # torch.manual_seed would also reseed every CUDA device's generator: the builder must not call it.
    monkeypatch.setattr(torch, "manual_seed", lambda *_: pytest.fail("torch.manual_seed called"))
    build_small_cnn(0)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_generator_seed_gives_the_int_seed_weights_and_is_advanced():
    g = torch.Generator().manual_seed(0)
    assert _digest(build_small_cnn(g)) == GOLDEN[0][1]
    with torch.random.fork_rng(devices=[]):  # what the generator would have drawn next, used directly
        torch.manual_seed(0)
        SmallCNN()
        expected_next = torch.rand(3)
    assert torch.equal(torch.rand(3, generator=g), expected_next)


def test_seeded_init_restores_the_global_state_after_an_error():
    before = torch.get_rng_state()
    with pytest.raises(ValueError, match="image_size must be >= 4"):
        build_small_cnn(0, image_size=2)
    with pytest.raises(RuntimeError, match="inside"):
        with seeded_init(1):
            torch.rand(5)
            raise RuntimeError("inside")
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("seed", [1.5, "0", True])
def test_a_seed_that_is_not_an_int_or_generator_is_refused(seed):
    with pytest.raises(TypeError, match="seed must be an int or a torch.Generator"):
        build_small_cnn(seed)


@pytest.mark.parametrize("c, k, size", [(1, 10, 28), (3, 4, 32), (1, 2, 8)])
def test_output_shape(c, k, size):
    assert build_small_cnn(0, c, k, size)(torch.zeros(2, c, size, size)).shape == (2, k)
