"""Sphinx header: construction by the sender, one-layer processing by a node.

Implements Sec. 3 of Danezis & Goldberg, "Sphinx: A Compact and Provably Secure
Mix Format" (S&P 2009) over X25519:

* ``alpha_0 = x G``; hop ``i`` shares ``s_i = y_i alpha_i`` with the sender and
  blinds ``alpha_{i+1} = b_i alpha_i`` with ``b_i`` derived from ``(alpha_i, s_i)``.
  Scalar multiplication commutes, so the sender reaches the same ``s_i`` as
  ``(x b_0 ... b_{i-1} mod L) Y_i`` and ``alpha_i`` as that scalar times ``G``
  (X25519 clamps; see :func:`~mixnet.crypto.scalar_for_x25519`).
* ``beta`` holds ``r`` fixed-size routing blocks encrypted with ChaCha20 under
  ``h_rho(s_i)``; the filler keeps its length constant after each peel.
* ``gamma = HMAC(h_mu(s_i), alpha_i || beta_i)`` (covering alpha too is a
  belt-and-braces addition to the paper, which MACs beta only).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .constants import (
    DELAY_SIZE,
    DELAY_UNIT_S,
    FLAG_FINAL,
    FLAG_FORWARD,
    GROUP_ELEMENT_SIZE,
    IDENTIFIER_SIZE,
    MAC_SIZE,
    NODE_ADDRESS_SIZE,
    ROUTING_BLOCK_SIZE,
    SCALAR_SIZE,
    PacketFormat,
)
from .crypto import (
    CURVE25519_L,
    HopKeys,
    RandomSource,
    check_point,
    clamped_scalar,
    derive_hop_keys,
    keystream,
    mac,
    mac_equal,
    scalar_for_x25519,
    scalarmult,
    scalarmult_base,
    stream_xor,
    xor_bytes,
)
from .errors import InvalidHeader

_MAX_DELAY_NS = 2 ** (8 * DELAY_SIZE) - 1


class Hop(NamedTuple):
    """One node on a path: its address (node id) and Sphinx public key."""

    address: int
    public_key: X25519PublicKey


def encode_address(address: int) -> bytes:
    if not 0 <= address < 2 ** (8 * NODE_ADDRESS_SIZE):
        raise ValueError(f"address must fit in {NODE_ADDRESS_SIZE} bytes, got {address}")
    return address.to_bytes(NODE_ADDRESS_SIZE, "big")


def decode_address(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def encode_delay(delay_s: float) -> bytes:
    if not (delay_s >= 0 and math.isfinite(delay_s)):
        raise ValueError(f"delay must be a finite number >= 0, got {delay_s}")
    return struct.pack(">Q", min(_MAX_DELAY_NS, round(delay_s / DELAY_UNIT_S)))


@dataclass(frozen=True, slots=True)
class ProcessedHeader:
    """Outcome of peeling one header layer.

    ``next_hop``/``delay``/``header`` are set for a forward hop; ``identifier`` for
    the final hop (all zero for a forward message, the SURB id for a reply).
    """

    keys: HopKeys
    is_final: bool
    next_hop: int = -1
    delay: float = 0.0
    header: bytes = b""
    identifier: bytes = b""


def _shared_secrets(route: Sequence[Hop], x: bytes) -> tuple[list[bytes], list[HopKeys]]:
    """Per-hop alphas and keys for ``route`` from the sender's ephemeral scalar ``x``.

    Sphinx Sec. 3.2: ``alpha_i = c_i G`` and ``s_i = c_i Y_i`` with
    ``c_i = x b_0 ... b_{i-1} mod L``, two scalar multiplications per hop (one
    of them fixed-base) instead of blinding every later point at every hop.
    Same bytes as :func:`_shared_secrets_sequential` for every public key on
    the curve (tested).
    """
    alphas = [scalarmult_base(x)]
    keys = [derive_hop_keys(scalarmult(x, route[0].public_key.public_bytes_raw()), alphas[0])]
    c = clamped_scalar(x)
    for hop in route[1:]:
        c = c * clamped_scalar(keys[-1].blinding) % CURVE25519_L
        scalar = scalar_for_x25519(c)
        if scalar is None:  # probability ~2^-126 per hop
            return _shared_secrets_sequential(route, x)
        alphas.append(scalarmult_base(scalar))
        keys.append(derive_hop_keys(scalarmult(scalar, hop.public_key.public_bytes_raw()), alphas[-1]))
    return alphas, keys


def _shared_secrets_sequential(route: Sequence[Hop], x: bytes) -> tuple[list[bytes], list[HopKeys]]:
    """:func:`_shared_secrets` by successive blindings, as relays do: nu(nu+1)/2 + 2nu - 2 multiplications."""
    alphas = [scalarmult_base(x)]
    # points[j] walks from x*Y_j to b_{j-1}...b_0 x Y_j = s_j, one blinding at a time.
    points = [scalarmult(x, hop.public_key.public_bytes_raw()) for hop in route]
    keys: list[HopKeys] = []
    for i in range(len(route)):
        hop_keys = derive_hop_keys(points[i], alphas[i])
        keys.append(hop_keys)
        if i + 1 < len(route):
            alphas.append(scalarmult(hop_keys.blinding, alphas[i]))
            for j in range(i + 1, len(route)):
                points[j] = scalarmult(hop_keys.blinding, points[j])
    return alphas, keys


def build_header(
    fmt: PacketFormat,
    route: Sequence[Hop],
    delays: Sequence[float],
    identifier: bytes,
    rng: RandomSource,
) -> tuple[bytes, list[HopKeys]]:
    """Build a header that makes ``route[i]`` forward to ``route[i+1]`` after ``delays[i]``.

    Parameters
    ----------
    route
        The nodes that process the packet, last one the destination; length ``1..r``.
    delays
        Hold time at each forwarding node (``len(route) - 1`` values, seconds).
    identifier
        Delivered to the final node: zeros for a forward message, a SURB id for a reply.

    Returns
    -------
    The header bytes and each hop's keys (the caller needs them for the payload).
    """
    nu, r, c = len(route), fmt.max_hops, ROUTING_BLOCK_SIZE
    if not 1 <= nu <= r:
        raise ValueError(f"route length must be in [1, {r}], got {nu}")
    if len(delays) != nu - 1:
        raise ValueError(f"delays must have len(route) - 1 = {nu - 1} values, got {len(delays)}")
    if len(identifier) != IDENTIFIER_SIZE:
        raise ValueError(f"identifier must be {IDENTIFIER_SIZE} bytes, got {len(identifier)}")
    alphas, keys = _shared_secrets(route, rng.random_bytes(SCALAR_SIZE))
    streams = [keystream(k.stream_key, fmt.stream_size) for k in keys]

    # Filler (Sphinx Sec. 3.2): phi_i = (phi_{i-1} || 0^c) XOR rho_{i-1}[(r-i+1)c : (r+1)c].
    filler = b""
    for i in range(nu - 1):
        filler = xor_bytes(filler + bytes(c), streams[i][(r - i) * c :])

    # Final block: flag || identifier || random padding (random, so the last hop
    # cannot count zero bytes to learn the path length).
    head_len = (r - nu + 1) * c
    final = bytes([FLAG_FINAL]) + identifier
    final += rng.random_bytes(head_len - len(final))
    beta = xor_bytes(final, streams[nu - 1][:head_len]) + filler
    gamma = mac(keys[nu - 1].mac_key, alphas[nu - 1], beta)
    for i in range(nu - 2, -1, -1):
        block = (
            bytes([FLAG_FORWARD])
            + encode_address(route[i + 1].address)
            + encode_delay(delays[i])
            + gamma
        )
        beta = stream_xor(keys[i].stream_key, block + beta[: (r - 1) * c])
        gamma = mac(keys[i].mac_key, alphas[i], beta)
    header = alphas[0] + beta + gamma
    assert len(header) == fmt.header_size
    return header, keys


def process_header(fmt: PacketFormat, private_key: X25519PrivateKey, header: bytes) -> ProcessedHeader:
    """Peel one layer with the node's private key.

    Raises
    ------
    InvalidHeader
        On a wrong length, a bad group element, a MAC mismatch or an unknown flag.
        Replay detection is the caller's job (it owns the cache); the tag is in
        ``ProcessedHeader.keys.replay_tag``.
    """
    if len(header) != fmt.header_size:
        raise InvalidHeader(f"header must be {fmt.header_size} bytes, got {len(header)}")
    c = ROUTING_BLOCK_SIZE
    alpha = header[:GROUP_ELEMENT_SIZE]
    beta = header[GROUP_ELEMENT_SIZE : GROUP_ELEMENT_SIZE + fmt.beta_size]
    gamma = header[GROUP_ELEMENT_SIZE + fmt.beta_size :]
    keys = derive_hop_keys(scalarmult(private_key.private_bytes_raw(), check_point(alpha)), alpha)
    if not mac_equal(mac(keys.mac_key, alpha, beta), gamma):
        raise InvalidHeader("header MAC mismatch")
    plain = stream_xor(keys.stream_key, beta + bytes(c))
    flag = plain[0]
    if flag == FLAG_FINAL:
        return ProcessedHeader(keys, True, identifier=plain[1 : 1 + IDENTIFIER_SIZE])
    if flag != FLAG_FORWARD:
        raise InvalidHeader(f"unknown routing flag {flag:#x}")
    pos = 1
    next_hop = decode_address(plain[pos : pos + NODE_ADDRESS_SIZE])
    pos += NODE_ADDRESS_SIZE
    (delay_ns,) = struct.unpack(">Q", plain[pos : pos + DELAY_SIZE])
    pos += DELAY_SIZE
    next_gamma = plain[pos : pos + MAC_SIZE]
    next_header = scalarmult(keys.blinding, alpha) + plain[c:] + next_gamma
    return ProcessedHeader(
        keys, False, next_hop=next_hop, delay=delay_ns * DELAY_UNIT_S, header=next_header
    )
