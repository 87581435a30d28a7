"""Sphinx packets: round trips, constant sizes, tamper rejection, replay, LIONESS."""

from __future__ import annotations

import hmac as std_hmac
import random

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from mixnet import constants as C
from mixnet.constants import PacketFormat
from mixnet.crypto import SeededRandomSource, lioness_decrypt, lioness_encrypt
from mixnet.errors import InvalidHeader, InvalidPacket, InvalidPayload, MixnetError, ReplayDetected
from mixnet.packet import Deliver, Forward, create_packet, process_packet
from mixnet.replay import ReplayCache
from mixnet.testing import SMALL_FORMAT, make_hops, make_keys, walk

KEYS = make_keys(7, seed=1)
HOPS = make_hops(KEYS)


def test_sizes_derive_from_security_parameter_hand_computed():
    k = C.SECURITY_PARAMETER
    assert k == 16
    assert C.ROUTING_BLOCK_SIZE == 1 + k + k // 2 + k == 41
    fmt = PacketFormat()  # r = 5, body 10,240
    assert fmt.header_size == 32 + 5 * 41 + 16 == 253
    assert fmt.packet_size == 253 + 10_240
    assert fmt.surb_size == 16 + 253 + 32


@pytest.mark.parametrize("nu", [1, 2, 3, 4, 5])
def test_round_trip_through_each_path_length(nu):
    rng = SeededRandomSource(nu)
    route = [HOPS[i] for i in range(1, nu + 1)]
    delays = [0.25 * (i + 1) for i in range(nu - 1)]
    message = b"fragment-%d" % nu
    packet = create_packet(SMALL_FORMAT, route, delays, message, rng)
    result, visited, forwards = walk(SMALL_FORMAT, KEYS, route[0].address, packet)
    assert visited == [h.address for h in route]
    assert [f.delay for f in forwards] == pytest.approx(delays, abs=1e-9)
    assert isinstance(result, Deliver)
    assert result.plaintext[: len(message)] == message
    assert not any(result.plaintext[len(message) :])


def test_round_trip_with_paper_body_size():
    fmt = PacketFormat()
    data = bytes(range(256)) * 39 + bytes(240)  # exactly plaintext_size = 10,224 bytes
    assert len(data) == fmt.plaintext_size
    packet = create_packet(fmt, [HOPS[2], HOPS[3]], [0.1], data, SeededRandomSource(0))
    result, _, _ = walk(fmt, KEYS, 2, packet)
    assert isinstance(result, Deliver) and result.plaintext[: len(data)] == data


def test_sizes_constant_whatever_the_path_length():
    rng = SeededRandomSource(3)
    seen = set()
    for nu in range(1, SMALL_FORMAT.max_hops + 1):
        packet = create_packet(SMALL_FORMAT, [HOPS[i] for i in range(nu)], [0.1] * (nu - 1), b"x", rng)
        seen.add(len(packet))
        _, _, forwards = walk(SMALL_FORMAT, KEYS, 0, packet)
        seen.update(len(f.packet) for f in forwards)
    assert seen == {SMALL_FORMAT.packet_size}


def _flip(packet: bytes, bit: int) -> bytes:
    raw = bytearray(packet)
    raw[bit // 8] ^= 1 << (bit % 8)
    return bytes(raw)


def test_any_single_bit_flip_is_rejected():
    rng = random.Random(7)
    route = [HOPS[1], HOPS[2], HOPS[3]]
    packet = create_packet(SMALL_FORMAT, route, [0.1, 0.1], b"secret update", SeededRandomSource(5))
    header_bits = SMALL_FORMAT.header_size * 8
    total_bits = len(packet) * 8
    positions = rng.sample(range(header_bits), 60) + rng.sample(range(header_bits, total_bits), 60)
    positions += [0, 255, 254, header_bits - 1, header_bits, total_bits - 1]  # alpha ends, gamma end, body ends
    for bit in positions:
        with pytest.raises((InvalidHeader, InvalidPayload)) as info:
            walk(SMALL_FORMAT, KEYS, 1, _flip(packet, bit))
        expected = InvalidHeader if bit < header_bits else InvalidPayload
        assert isinstance(info.value, expected), f"bit {bit}: {info.value!r}"


def test_non_canonical_alpha_encoding_is_rejected():
    packet = create_packet(SMALL_FORMAT, [HOPS[1]], [], b"x", SeededRandomSource(9))
    # Setting bit 255 names the same point under RFC 7748 decoding; it must not pass.
    with pytest.raises(InvalidHeader, match="non-canonical"):
        process_packet(SMALL_FORMAT, KEYS[1], _flip(packet, 255))


def test_wrong_length_is_rejected_before_any_crypto():
    packet = create_packet(SMALL_FORMAT, [HOPS[1]], [], b"x", SeededRandomSource(9))
    for bad in (packet[:-1], packet + b"\x00", b""):
        with pytest.raises(InvalidPacket):
            process_packet(SMALL_FORMAT, KEYS[1], bad)


def test_replayed_packet_is_dropped():
    cache = ReplayCache()
    packet = create_packet(SMALL_FORMAT, [HOPS[1], HOPS[2]], [0.1], b"x", SeededRandomSource(11))
    first = process_packet(SMALL_FORMAT, KEYS[1], packet, cache)
    assert isinstance(first, Forward)
    with pytest.raises(ReplayDetected):
        process_packet(SMALL_FORMAT, KEYS[1], packet, cache)
    # A fresh packet with the same content is not a replay (fresh ephemeral key).
    again = create_packet(SMALL_FORMAT, [HOPS[1], HOPS[2]], [0.1], b"x", SeededRandomSource(12))
    assert isinstance(process_packet(SMALL_FORMAT, KEYS[1], again, cache), Forward)


def test_replay_cache_memory_bound_and_window():
    cache = ReplayCache(capacity=4)
    tags = [bytes([i]) * 16 for i in range(20)]
    for tag in tags:
        assert not cache.check_and_add(tag)
        assert len(cache) <= 8
    # The last `capacity` tags are always inside the detection window.
    assert all(cache.check_and_add(t) for t in tags[-4:])
    assert not cache.seen(tags[0])
    with pytest.raises(ValueError, match="capacity"):
        ReplayCache(0)


def test_lioness_matches_independent_construction():
    """Recompute LIONESS with stdlib HMAC and a raw ChaCha20 keystream XOR."""
    rng = random.Random(2)
    key, block = rng.randbytes(128), rng.randbytes(300)

    def xor(a: bytes, b: bytes) -> bytes:
        return bytes(x ^ y for x, y in zip(a, b))

    def stream(k: bytes, n: int) -> bytes:
        return Cipher(algorithms.ChaCha20(k, bytes(16)), None).encryptor().update(bytes(n))

    k1, k2, k3, k4 = key[:32], key[32:64], key[64:96], key[96:]
    left, right = block[:32], block[32:]
    right = xor(right, stream(xor(left, k1), len(right)))
    left = xor(left, std_hmac.digest(k2, right, "sha256"))
    right = xor(right, stream(xor(left, k3), len(right)))
    left = xor(left, std_hmac.digest(k4, right, "sha256"))
    assert lioness_encrypt(key, block) == left + right
    assert lioness_decrypt(key, left + right) == block


def test_lioness_is_wide_block_one_flip_garbles_everything():
    rng = random.Random(4)
    key, block = rng.randbytes(128), bytes(2048)
    ciphertext = bytearray(lioness_encrypt(key, block))
    ciphertext[1500] ^= 0x01
    garbled = lioness_decrypt(key, bytes(ciphertext))
    changed = sum(bin(a ^ b).count("1") for a, b in zip(garbled, block)) / (8 * len(block))
    assert 0.45 < changed < 0.55  # ~half of all bits, including the left part
    assert garbled[:16] != bytes(16)


def test_every_failure_is_a_mixnet_error_subclass():
    for err in (InvalidHeader, InvalidPayload, InvalidPacket, ReplayDetected):
        assert issubclass(err, MixnetError)
