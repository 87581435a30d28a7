"""Whole Sphinx packets: creation by a sender, processing by the node owning the key.

A packet is ``header || body``, always ``fmt.packet_size`` bytes whatever the
path length, whether it carries data, an acknowledgement (SURB reply) or cover.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from .constants import FORWARD_IDENTIFIER, PacketFormat
from .crypto import RandomSource, mac_equal
from .errors import InvalidPacket, ReplayDetected
from .header import Hop, build_header, process_header
from .payload import check_body, peel_layer, wrap_body
from .replay import ReplayCache


@dataclass(frozen=True, slots=True)
class Forward:
    """Relay outcome: send ``packet`` to ``next_hop`` after holding it ``delay`` seconds."""

    next_hop: int
    delay: float
    packet: bytes


@dataclass(frozen=True, slots=True)
class Deliver:
    """Final hop of a forward message: the checked plaintext area."""

    plaintext: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    """Final hop of a SURB reply: only the SURB's creator can open ``body``."""

    surb_id: bytes
    body: bytes


def split_packet(fmt: PacketFormat, packet: bytes) -> tuple[bytes, bytes]:
    """Header and body; the length is checked before anything else."""
    if not isinstance(packet, (bytes, bytearray, memoryview)):
        raise InvalidPacket(f"packet must be bytes, got {type(packet).__name__}")
    if len(packet) != fmt.packet_size:
        raise InvalidPacket(f"packet must be {fmt.packet_size} bytes, got {len(packet)}")
    packet = bytes(packet)
    return packet[: fmt.header_size], packet[fmt.header_size :]


def create_packet(
    fmt: PacketFormat,
    route: Sequence[Hop],
    delays: Sequence[float],
    plaintext: bytes,
    rng: RandomSource,
) -> bytes:
    """Onion-encrypt ``plaintext`` for ``route`` (send the result to ``route[0]``).

    Parameters
    ----------
    route
        Processing nodes, destination last (1..``fmt.max_hops`` of them).
    delays
        Hold time at each relay, ``len(route) - 1`` values in seconds.
    plaintext
        At most ``fmt.plaintext_size`` bytes; padded to a fixed body size.
    """
    header, keys = build_header(fmt, route, delays, FORWARD_IDENTIFIER, rng)
    return header + wrap_body(fmt, plaintext, keys)


def process_packet(
    fmt: PacketFormat,
    private_key: X25519PrivateKey,
    packet: bytes,
    replay_cache: ReplayCache | None = None,
) -> Forward | Deliver | Reply:
    """Peel one layer: relay onward, deliver, or hand a SURB reply to its creator.

    Raises
    ------
    InvalidPacket, InvalidHeader, InvalidPayload
        Malformed or tampered packet.
    ReplayDetected
        The replay tag is in ``replay_cache`` (checked after the MAC, so forged
        packets cannot fill the cache).
    """
    header, body = split_packet(fmt, packet)
    result = process_header(fmt, private_key, header)
    if replay_cache is not None and replay_cache.check_and_add(result.keys.replay_tag):
        raise ReplayDetected("replay tag already seen")
    body = peel_layer(fmt, body, result.keys)
    if not result.is_final:
        return Forward(result.next_hop, result.delay, result.header + body)
    if mac_equal(result.identifier, FORWARD_IDENTIFIER):
        return Deliver(check_body(fmt, body))
    return Reply(result.identifier, body)
