"""Helpers for tests and benchmarks: deterministic keys, and walking a packet along its path.

Not used by the transport itself. ``walk`` runs each hop's real processing with
that hop's own key, exactly as the nodes would, minus the network.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from .constants import PacketFormat
from .crypto import SeededRandomSource, private_key_from_bytes
from .header import Hop
from .packet import Deliver, Forward, Reply, process_packet
from .replay import ReplayCache

#: Small bodies keep tests fast; every size still derives from the same constants.
SMALL_FORMAT = PacketFormat(max_hops=5, payload_size=1024)


def make_keys(n: int, seed: int = 0) -> dict[int, X25519PrivateKey]:
    """``n`` node keys ``0..n-1`` from a seeded DRBG (reproducible, not for deployment)."""
    rng = SeededRandomSource(seed, b"test-keys")
    return {i: private_key_from_bytes(rng.random_bytes(32)) for i in range(n)}


def make_hops(keys: dict[int, X25519PrivateKey]) -> dict[int, Hop]:
    return {i: Hop(i, k.public_key()) for i, k in keys.items()}


def walk(
    fmt: PacketFormat,
    keys: dict[int, X25519PrivateKey],
    first_hop: int,
    packet: bytes,
    caches: dict[int, ReplayCache] | None = None,
) -> tuple[Deliver | Reply, list[int], list[Forward]]:
    """Process ``packet`` hop by hop; returns the final result, the visited nodes and each relay's output."""
    caches = caches if caches is not None else {i: ReplayCache() for i in keys}
    node, visited, forwards = first_hop, [], []
    while True:
        visited.append(node)
        result = process_packet(fmt, keys[node], packet, caches[node])
        if not isinstance(result, Forward):
            return result, visited, forwards
        forwards.append(result)
        node, packet = result.next_hop, result.packet
