"""Sphinx payload body: padding, layered LIONESS encryption, destination check.

The sender encrypts ``0^k || plaintext`` once per hop, innermost layer for the
destination; every hop removes one layer with :func:`peel_layer`. LIONESS is a
wide-block cipher, so a single flipped bit anywhere in the body garbles all of
it and the destination's zero-prefix check fails (probability of a false accept
``2^-128``). Relays cannot detect body tampering; the destination always can.
"""

from __future__ import annotations

from collections.abc import Sequence

from .constants import ZERO_PREFIX_SIZE, PacketFormat
from .crypto import HopKeys, lioness_decrypt, lioness_encrypt, mac_equal
from .errors import InvalidPayload

_ZERO_PREFIX = bytes(ZERO_PREFIX_SIZE)


def pad_plaintext(fmt: PacketFormat, plaintext: bytes) -> bytes:
    """``0^k || plaintext || 0...``: exactly ``fmt.payload_size`` bytes."""
    if len(plaintext) > fmt.plaintext_size:
        raise ValueError(f"plaintext must be <= {fmt.plaintext_size} bytes, got {len(plaintext)}")
    return _ZERO_PREFIX + plaintext + bytes(fmt.plaintext_size - len(plaintext))


def wrap_body(fmt: PacketFormat, plaintext: bytes, keys: Sequence[HopKeys]) -> bytes:
    """Encrypt the padded plaintext for a path whose hops hold ``keys`` (first hop first)."""
    body = pad_plaintext(fmt, plaintext)
    for hop_keys in reversed(keys):
        body = lioness_encrypt(hop_keys.payload_key, body)
    return body


def peel_layer(fmt: PacketFormat, body: bytes, keys: HopKeys) -> bytes:
    """Remove this hop's layer."""
    if len(body) != fmt.payload_size:
        raise InvalidPayload(f"body must be {fmt.payload_size} bytes, got {len(body)}")
    return lioness_decrypt(keys.payload_key, body)


def check_body(fmt: PacketFormat, body: bytes) -> bytes:
    """Destination check: the fully decrypted body must start with ``k`` zero bytes.

    Returns the plaintext area (``fmt.plaintext_size`` bytes, trailing padding included).
    """
    if len(body) != fmt.payload_size:
        raise InvalidPayload(f"body must be {fmt.payload_size} bytes, got {len(body)}")
    if not mac_equal(body[:ZERO_PREFIX_SIZE], _ZERO_PREFIX):
        raise InvalidPayload("payload integrity check failed (tampered or misrouted body)")
    return body[ZERO_PREFIX_SIZE:]
