"""One node's learner (no Flower, no network): train, fragment, choose receivers, aggregate.

The ClientApp calls these functions; tests call them directly.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from privacy.fragments import FragmentLayout, encode, layout_for, split
from privacy.mixnet.constants import PacketFormat
from privacy.mixnet.messages import fragment_capacity
from strategies.fragment_pool import AggregationStats, FragmentPool, frag_fedavg, frag_krum


def packet_capacity(payload_size: int, header_hops: int = 5) -> int:
    """Application bytes one Sphinx packet carries (9,894 for a 10,240-byte body)."""
    return fragment_capacity(PacketFormat(header_hops, payload_size))


def fragment_layout(num_values: int, payload_size: int, encoding: str) -> FragmentLayout:
    """Common fragment ranges for this model size, body size and encoding."""
    return layout_for(num_values, packet_capacity(payload_size), encoding)


def train_local(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float, momentum: float,
                weight_decay: float, batch_size: int, epochs: int, generator: torch.Generator) -> tuple[float, int]:
    """Plain SGD with shuffled mini-batches; returns (mean loss, examples seen)."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    total, seen = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for s in range(0, len(x), batch_size):
            idx = order[s : s + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
    return total / max(seen, 1), seen


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2048) -> tuple[float, float]:
    """(accuracy, mean cross-entropy)."""
    model.eval()
    correct, loss = 0, 0.0
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    for s in range(0, len(x), batch_size):
        out = model(x[s : s + batch_size])
        loss += float(loss_fn(out, y[s : s + batch_size]))
        correct += int((out.argmax(1) == y[s : s + batch_size]).sum())
    return correct / max(len(x), 1), loss / max(len(x), 1)


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


def node_generator(seed: int, round_: int, node: int, stream: int) -> np.random.Generator:
    """Per (seed, round, node, purpose) generator: same seed, same fragments and choices."""
    return np.random.default_rng([seed, round_, node, stream])


def torch_generator(seed: int, round_: int, node: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + round_) * 10_007 + node)
    return g
