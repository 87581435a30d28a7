"""registry.streams' per-client streams reproduce each study's old per-client derivation exactly.

The published tables were computed with these formulas (copied here as they were before the
shared helper); a study's numbers change if its generator does.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from flower_apps.tabular_pdp.model import client_generator as tabular_client_generator
from flower_apps.ultrasound.train import client_seed as ultrasound_client_seed
from flower_apps.unlinkable_dfl.node import node_generator, torch_generator
from registry.streams import ClientSeed, seed_int
from registry.streams import torch_generator as stream_generator


def dfl_client_generator(seed: int, r: int, c: int) -> torch.Generator:  # what dfl-dp's ClientApp draws
    return stream_generator("clients.sgd", seed, r, c)

CASES = list(itertools.product((0, 7, 2**31 - 1, 10**9), (0, 500), (3, 10**4)))


def _old_dfl_dp(seed: int, r: int, c: int) -> torch.Generator:  # flower_apps/dfl_dp/train.py
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + r) * 10_007 + c)
    return g


def _old_tabular_pdp(seed: int, r: int, c: int) -> torch.Generator:  # flower_apps/tabular_pdp/model.py
    return torch.Generator().manual_seed(((seed * 1_000_003 + r) * 1_000_003 + c) % (2**63))


def _old_ultrasound(seed: int, r: int, c: int) -> int:  # flower_apps/ultrasound/train.py
    return ((seed * 1_000_003 + r) * 10_007 + c) % (2**62)


def _same(new, old, *args) -> bool:
    """Same seed and same numbers, or the same refusal (dfl-dp's unreduced seed can exceed 64 bits)."""
    try:
        h = old(*args)
    except (ValueError, RuntimeError) as exc:
        with pytest.raises(type(exc)):
            new(*args)
        return True
    g = new(*args)
    return g.initial_seed() == h.initial_seed() and torch.equal(torch.randperm(50, generator=g),
                                                                torch.randperm(50, generator=h))


@pytest.mark.parametrize("seed, r, c", CASES)
def test_every_study_keeps_its_derivation(seed, r, c):
    assert _same(dfl_client_generator, _old_dfl_dp, seed, r, c)
    assert _same(torch_generator, _old_dfl_dp, seed, r, c)  # unlinkable-dfl used dfl-dp's formula
    assert _same(tabular_client_generator, _old_tabular_pdp, seed, r, c)
    assert ultrasound_client_seed(seed, r, c) == _old_ultrasound(seed, r, c)


@pytest.mark.parametrize("name, tag", [("unlinkable-dfl.quantization", 1), ("unlinkable-dfl.sends", 2),
                                       ("unlinkable-dfl.byzantine-values", 3)])
def test_unlinkable_node_streams_are_numpy_seed_sequences_of_the_whole_key(name, tag):
    from flower_apps.unlinkable_dfl import client_app

    assert name in (client_app.STREAM_QUANT, client_app.STREAM_SENDS, client_app.STREAM_BYZ)
    for seed, r, node in [(0, 1, 2), (5, 0, 31), (2**40, 3, 1)]:
        old = np.random.default_rng([seed, r, node, tag])  # flower_apps/unlinkable_dfl/node.py, before the registry
        assert np.array_equal(node_generator(seed, r, node, name).integers(0, 2**62, 20), old.integers(0, 2**62, 20))


def test_hand_computed_seed_and_distinct_clients():
    assert seed_int("clients.sgd", 2, 3, 4) == (2 * 1_000_003 + 3) * 10_007 + 4 == 20_014_090_067
    assert ClientSeed(1_000_003, 97)(2, 3, 4) == ((2 * 1_000_003 + 3) * 1_000_003 + 4) % 97
    seeds = {seed_int("clients.sgd", s, r, c) for s in range(3) for r in range(5) for c in range(100)}
    assert len(seeds) == 3 * 5 * 100
    assert stream_generator("clients.sgd", 1, 2, 3).initial_seed() == seed_int("clients.sgd", 1, 2, 3)
