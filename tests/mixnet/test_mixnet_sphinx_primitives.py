"""Raw X25519 (libsodium) and the sender's combined blinding scalars give today's packets, byte for byte.

Reference: the primitive the format was built on, ``cryptography``'s
``X25519PrivateKey.from_private_bytes(n).exchange(point)``, and the sender's
step-by-step blinding; plus a digest of packets made by the code before the
switch (recorded once, so a change of format cannot go unnoticed).
"""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from mixnet import header as header_module
from mixnet.crypto import (
    CURVE25519_L,
    SeededRandomSource,
    clamped_scalar,
    scalar_for_x25519,
    scalarmult,
    scalarmult_base,
)
from mixnet.errors import InvalidHeader
from mixnet.packet import Deliver, create_packet
from mixnet.surb import create_surb
from mixnet.testing import SMALL_FORMAT, make_hops, make_keys, walk

KEYS = make_keys(7, seed=1)
HOPS = make_hops(KEYS)
#: sha256 over the packets, hop outputs and SURB of ``_golden_material`` as made by the
#: code before libsodium (OpenSSL X25519, step-by-step blinding everywhere).
GOLDEN_SHA256 = "13e1644285b7959f1af997f5ba67c9b2407a07e7006b213ebd4de731c8ef9437"
LOW_ORDER_CANONICAL = [
    bytes(32),
    (1).to_bytes(32, "little"),
    (2**255 - 19 - 1).to_bytes(32, "little"),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
]


def _openssl_scalarmult(scalar: bytes, point: bytes) -> bytes:
    """The old primitive: load the scalar as a private key (OpenSSL derives its public key), then exchange."""
    try:
        return X25519PrivateKey.from_private_bytes(scalar).exchange(X25519PublicKey.from_public_bytes(point))
    except ValueError as exc:
        raise InvalidHeader("low-order group element") from exc


def _openssl_scalarmult_base(scalar: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(scalar).public_key().public_bytes_raw()


@pytest.fixture
def old_primitives(monkeypatch):
    """Header code on OpenSSL X25519 with step-by-step blinding: the format as it was built."""
    monkeypatch.setattr(header_module, "scalarmult", _openssl_scalarmult)
    monkeypatch.setattr(header_module, "scalarmult_base", _openssl_scalarmult_base)
    monkeypatch.setattr(header_module, "_shared_secrets", header_module._shared_secrets_sequential)


def _golden_material() -> bytes:
    """Packets for every path length, every hop's output, the delivered plaintexts and a SURB."""
    out = []
    for nu in range(1, 6):
        route = [HOPS[i] for i in range(1, nu + 1)]
        packet = create_packet(SMALL_FORMAT, route, [0.25] * (nu - 1), b"golden-%d" % nu, SeededRandomSource(100 + nu))
        result, _, forwards = walk(SMALL_FORMAT, KEYS, route[0].address, packet)
        assert isinstance(result, Deliver)
        out += [packet, *(f.packet for f in forwards), result.plaintext]
    surb, secret = create_surb(SMALL_FORMAT, [HOPS[3], HOPS[4], HOPS[0]], [0.1, 0.2], SeededRandomSource(9))
    out += [surb.to_bytes(), *secret.hop_payload_keys]
    return b"".join(out)


def test_scalarmult_matches_openssl_exchange_including_unclamped_bits():
    rng = SeededRandomSource(0, b"scalars")
    points = [scalarmult_base(rng.random_bytes(32)) for _ in range(4)]
    scalars = [rng.random_bytes(32) for _ in range(6)] + [b"\xff" * 32, bytes(31) + b"\x80", b"\x07" + bytes(31)]
    for n in scalars:
        assert scalarmult_base(n) == _openssl_scalarmult_base(n)
        for p in points:
            assert scalarmult(n, p) == _openssl_scalarmult(n, p)


def test_scalarmult_rfc7748_vector():
    scalar = bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4")
    u = bytes.fromhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c")
    assert scalarmult(scalar, u).hex() == "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"


@pytest.mark.parametrize("point", LOW_ORDER_CANONICAL, ids=lambda p: p.hex()[:8])
def test_low_order_point_is_an_invalid_header_as_before(point):
    for mult in (scalarmult, _openssl_scalarmult):
        with pytest.raises(InvalidHeader, match="low-order"):
            mult(b"\x11" * 32, point)


def test_clamped_scalar_hand_computed():
    assert clamped_scalar(bytes(32)) == 2**254
    assert clamped_scalar(b"\xff" * 32) == 2**255 - 8
    assert clamped_scalar(b"\x0f" + bytes(31)) == 2**254 + 8


def test_combined_scalar_equals_successive_blindings():
    rng = SeededRandomSource(1, b"combined")
    for _ in range(20):
        x, b0, b1 = (rng.random_bytes(32) for _ in range(3))
        point = scalarmult_base(rng.random_bytes(32))  # a public key
        c = clamped_scalar(x) * clamped_scalar(b0) * clamped_scalar(b1) % CURVE25519_L
        s = scalar_for_x25519(c)
        assert s is not None and clamped_scalar(s) == int.from_bytes(s, "little")  # X25519 leaves it as is
        assert scalarmult(s, point) == scalarmult(b1, scalarmult(b0, scalarmult(x, point)))
        assert scalarmult_base(s) == scalarmult(b1, scalarmult(b0, scalarmult_base(x)))


def test_scalar_for_x25519_refuses_the_unreachable_residues():
    # n / 8 = t must be in [2^251, 2^252) up to sign; t = 1 and t = 2^252 are not, nor are -1 and -2^252.
    assert scalar_for_x25519(8) is None
    assert scalar_for_x25519(8 * 2**252 % CURVE25519_L) is None
    assert scalar_for_x25519(8 * 2**251) == (8 * 2**251).to_bytes(32, "little")
    n = clamped_scalar(SeededRandomSource(2).random_bytes(32)) * 12345 % CURVE25519_L
    minus = scalar_for_x25519(CURVE25519_L - n)
    assert minus is not None and scalarmult_base(minus) == scalarmult_base(scalar_for_x25519(n))  # u(-nG) = u(nG)


def test_packets_byte_identical_to_the_code_before_the_switch():
    assert hashlib.sha256(_golden_material()).hexdigest() == GOLDEN_SHA256


def test_packets_byte_identical_with_old_primitive(old_primitives):
    assert hashlib.sha256(_golden_material()).hexdigest() == GOLDEN_SHA256


def test_new_sender_and_old_relays_interoperate(monkeypatch):
    """Packets built with libsodium, peeled hop by hop by the OpenSSL code, and the reverse."""
    route = [HOPS[i] for i in (2, 5, 1, 4)]
    new_packet = create_packet(SMALL_FORMAT, route, [0.1] * 3, b"new", SeededRandomSource(11))
    new_walk = walk(SMALL_FORMAT, KEYS, 2, new_packet)
    with monkeypatch.context() as m:
        m.setattr(header_module, "scalarmult", _openssl_scalarmult)
        m.setattr(header_module, "scalarmult_base", _openssl_scalarmult_base)
        m.setattr(header_module, "_shared_secrets", header_module._shared_secrets_sequential)
        old_packet = create_packet(SMALL_FORMAT, route, [0.1] * 3, b"new", SeededRandomSource(11))
        old_walk = walk(SMALL_FORMAT, KEYS, 2, new_packet)
    assert old_packet == new_packet
    assert old_walk == new_walk and new_walk[0].plaintext.startswith(b"new")


def test_fallback_to_successive_blinding_gives_the_same_packet(monkeypatch):
    route = [HOPS[i] for i in (1, 2, 3)]
    expected = create_packet(SMALL_FORMAT, route, [0.1, 0.2], b"x", SeededRandomSource(4))
    calls = []
    monkeypatch.setattr(header_module, "scalar_for_x25519", lambda n: calls.append(n))  # always None
    assert create_packet(SMALL_FORMAT, route, [0.1, 0.2], b"x", SeededRandomSource(4)) == expected
    assert calls  # the fallback really ran
