"""Helpers for tests and benchmarks: deterministic keys, walking a packet along its path, hostile inputs.

Not used by the transport itself. ``walk`` runs each hop's real processing with
that hop's own key, exactly as the nodes would, minus the network.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .constants import PacketFormat
from .crypto import SeededRandomSource, private_key_from_bytes, public_bytes
from .header import Hop
from .identity import identity_from_source
from .packet import Deliver, Forward, Reply, create_packet, process_packet
from .peers import PeerInfo
from .replay import ReplayCache
from .wire import packet_frame

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
    node = first_hop
    visited: list[int] = []
    forwards: list[Forward] = []
    while True:
        visited.append(node)
        result = process_packet(fmt, keys[node], packet, caches[node])
        if not isinstance(result, Forward):
            return result, visited, forwards
        forwards.append(result)
        node, packet = result.next_hop, result.packet


def attacker_record(node_id: int, seed: int, endpoint: str = "", version: int = 0) -> PeerInfo:
    """A validly self-signed record claiming ``node_id`` under an attacker's own identity and Sphinx key.

    What an authenticated malicious peer can make for any node id; a view that
    already knows ``node_id`` must refuse it as a hijack.
    """
    rng = SeededRandomSource(seed, b"attacker")
    sphinx_key = private_key_from_bytes(rng.random_bytes(32))
    return PeerInfo.signed(identity_from_source(rng), node_id, public_bytes(sphinx_key), endpoint, version)


def frame_to(fmt: PacketFormat, dst: PeerInfo, plaintext: bytes, rng: SeededRandomSource) -> bytes:
    """A PACKET frame that ``dst`` peels as final hop (built with the key its record names)."""
    hop = Hop(dst.node_id, X25519PublicKey.from_public_bytes(dst.public_key))
    return packet_frame(create_packet(fmt, [hop], [], plaintext, rng))
