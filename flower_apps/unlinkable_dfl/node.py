"""One node's learner (no Flower, no network): train, fragment, choose receivers, aggregate.

The ClientApp calls these functions; tests call them directly. Training and evaluation are
:mod:`flower_apps.common.local_training` (plain SGD, as in dfl-dp without clipping); the
batch-order generator is the shared per-client stream ``clients.sgd`` of :mod:`registry.streams`
(dfl-dp's derivation, which this study's published numbers used).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from flower_apps.common.local_training import evaluate, train_local
from flower_apps.unlinkable_dfl.fragment_pool import AggregationStats, FragmentPool, frag_fedavg, frag_krum
from mixnet.constants import PacketFormat
from mixnet.messages import fragment_capacity
from privacy.fragments import FragmentLayout, encode, layout_for, split
from registry import streams

# Re-exported for the ClientApp: the shared learner and the batch-order generator.
__all__ = ["aggregate", "choose_sends", "corrupt", "encode_state", "evaluate", "fragment_layout", "node_generator",
           "packet_capacity", "torch_generator", "train_local"]


def packet_capacity(payload_size: int, header_hops: int = 5) -> int:
    """Application bytes one Sphinx packet carries (9,894 for a 10,240-byte body)."""
    return fragment_capacity(PacketFormat(header_hops, payload_size))


def fragment_layout(num_values: int, payload_size: int, encoding: str) -> FragmentLayout:
    """Common fragment ranges for this model size, body size and encoding."""
    return layout_for(num_values, packet_capacity(payload_size), encoding)


def corrupt(vector: np.ndarray, attack: str, scale: float, rng: np.random.Generator) -> np.ndarray:
    """What a Byzantine node shares instead of its state.

    ``arbitrary``: i.i.d. ``N(0, scale^2)`` values; ``scaled``: the honest state times ``-scale``.
    """
    if attack == "arbitrary":
        return rng.normal(0.0, scale, size=vector.shape).astype(np.float32)
    if attack == "scaled":
        return (-scale * vector).astype(np.float32)
    raise ValueError(f"attack must be 'arbitrary' or 'scaled', got {attack!r}")


def encode_state(vector: np.ndarray, layout: FragmentLayout, round_: int, encoding: str,
                 rng: np.random.Generator) -> list[bytes]:
    """Every fragment of ``vector``, encoded (index i = layout range i)."""
    return [encode(f, encoding, rng) for f in split(vector, layout, round_)]


def choose_sends(neighbours: list[int], num_fragments: int, share_ratio: float,
                 rng: np.random.Generator) -> list[tuple[int, int]]:
    """Selective transmission: to each neighbour, an independent random ``ceil(r F)`` of the F fragments.

    Returns ``(destination, fragment index)`` pairs in a random order (the order the
    node hands them to its outbox).
    """
    if not 0 < share_ratio <= 1:
        raise ValueError(f"share_ratio must be in (0, 1], got {share_ratio}")
    k = max(1, math.ceil(share_ratio * num_fragments - 1e-9))
    sends = [(dst, int(i)) for dst in neighbours for i in np.sort(rng.choice(num_fragments, k, replace=False))]
    order = rng.permutation(len(sends))
    return [sends[j] for j in order]


def aggregate(local: np.ndarray, layout: FragmentLayout, round_: int, payloads: list[bytes], aggregator: str,
              krum_budget: int = 1, krum_fallback: str = "median") -> tuple[np.ndarray, AggregationStats]:
    """Pool the local state with the received encoded fragments and aggregate it."""
    pool = FragmentPool(local, layout, round_)
    for data in payloads:
        pool.add_bytes(data)
    if aggregator == "fedavg":
        return frag_fedavg(pool)
    if aggregator == "krum":
        return frag_krum(pool, krum_budget, krum_fallback)
    raise ValueError(f"aggregator must be 'fedavg' or 'krum', got {aggregator!r}")


def node_generator(seed: int, round_: int, node: int, stream: str) -> np.random.Generator:
    """Per (seed, round, node, purpose) generator: ``stream`` names an ``unlinkable-dfl.*`` stream of
    :mod:`registry.streams` keyed by (seed, round, node); same seed, same fragments and choices."""
    return streams.rng(stream, seed, round_, node)


def torch_generator(seed: int, round_: int, node: int) -> torch.Generator:
    """Batch order of a node's local training in a round (the shared stream ``clients.sgd``)."""
    return streams.torch_generator("clients.sgd", seed, round_, node)
