"""Per-client seeds: one derivation of (run seed, round, client) for every study.

``client_seed = (seed * ROUND_MULTIPLIER + round) * client_multiplier + client`` (then ``% modulus``).
The studies' published tables were computed with slightly different constants
(``client_multiplier`` 10,007 or 1,000,003; modulus none, 2**62 or 2**63); each study passes its
own so that its numbers stay the same, and ``tests/flower_apps/test_common_seeding.py`` pins
every study's old formula against this one. New code takes the defaults.

Streams of one node that need independent numpy generators (fragments, receivers, attacks)
use :func:`stream_rng`, numpy's SeedSequence over the whole key.
"""

from __future__ import annotations

import numpy as np
import torch

ROUND_MULTIPLIER = 1_000_003  # a prime > any round count: (seed, round) pairs do not collide
CLIENT_MULTIPLIER = 10_007  # a prime > any client count: (seed, round, client) triples do not collide


def client_seed(seed: int, server_round: int, client_id: int, *, client_multiplier: int = CLIENT_MULTIPLIER,
                modulus: int | None = None) -> int:
    """The integer seed of client ``client_id`` in ``server_round`` of a run seeded ``seed``."""
    s = (seed * ROUND_MULTIPLIER + server_round) * client_multiplier + client_id
    return s if modulus is None else s % modulus


def client_generator(seed: int, server_round: int, client_id: int, *, client_multiplier: int = CLIENT_MULTIPLIER,
                     modulus: int | None = None) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`client_seed` (batch order, dropout, augmentation)."""
    g = torch.Generator()
    g.manual_seed(client_seed(seed, server_round, client_id, client_multiplier=client_multiplier, modulus=modulus))
    return g


def stream_rng(*key: int) -> np.random.Generator:
    """``np.random.default_rng(list(key))``: e.g. ``(seed, round, node, stream)``, one generator per purpose."""
    return np.random.default_rng(list(key))
