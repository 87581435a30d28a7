"""Thin wrappers over ``cryptography`` and libsodium primitives used by the Sphinx format.

Nothing here is a home-made primitive: HKDF-SHA256, HMAC-SHA256 and ChaCha20
come from ``cryptography`` (OpenSSL), node keys are ``cryptography`` X25519
objects, and the per-packet X25519 scalar multiplications are libsodium's
(through PyNaCl): ``cryptography`` has no raw scalar multiplication, and
loading a per-packet blinding factor as an ``X25519PrivateKey`` makes OpenSSL
derive its public key, one wasted multiplication per hop. Both implement RFC
7748 X25519 (same clamping), so the bytes are the same (pinned by a test).
LIONESS (Anderson & Biham, 1996) is the standard composition of a stream
cipher and a keyed hash into a wide-block cipher; we instantiate it with
ChaCha20 and HMAC-SHA256, as Katzenpost does with ChaCha20 + BLAKE2b.
"""

from __future__ import annotations

import hashlib
import hmac as std_hmac
import os
from typing import NamedTuple, Protocol

from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand
from nacl.bindings import crypto_scalarmult, crypto_scalarmult_base
from nacl.exceptions import RuntimeError as SodiumRuntimeError

from .constants import (
    BLINDING_FACTOR_SIZE,
    GROUP_ELEMENT_SIZE,
    HKDF_INFO,
    HOP_KEY_MATERIAL_SIZE,
    LIONESS_KEY_SIZE,
    LIONESS_LEFT_SIZE,
    LIONESS_ROUND_KEY_SIZE,
    MAC_KEY_SIZE,
    MAC_SIZE,
    REPLAY_TAG_SIZE,
    SCALAR_SIZE,
    STREAM_KEY_SIZE,
    STREAM_NONCE_SIZE,
    SURB_KEY_INFO,
)
from .errors import InvalidHeader, InvalidPeerKey

#: Field prime of Curve25519; canonical u-coordinates are < P.
CURVE25519_P: int = 2**255 - 19
#: Order of Curve25519's prime-order subgroup (RFC 7748, Sec. 4.1); the curve has 8 L points.
CURVE25519_L: int = 2**252 + 27742317777372353535851937790883648493
_INV8_MOD_L = pow(8, -1, CURVE25519_L)
_ZERO_NONCE = bytes(STREAM_NONCE_SIZE)
_SHA256 = hashes.SHA256()


# --- randomness ---------------------------------------------------------------
class RandomSource(Protocol):
    """Where ephemeral keys, SURB ids and padding come from."""

    def random_bytes(self, n: int) -> bytes: ...


class SystemRandomSource:
    """``os.urandom``: the only source to use in deployment."""

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)


class SeededRandomSource:
    """Deterministic ChaCha20 keystream DRBG, for reproducible simulations only.

    Same seed, same bytes: a simulation replays bit for bit. Never use it in the
    real-network mode (its keys would be predictable from the seed).
    """

    _CHUNK = 1 << 16

    def __init__(self, seed: int | bytes, label: bytes = b"") -> None:
        seed_bytes = seed if isinstance(seed, bytes) else str(int(seed)).encode()
        key = hashlib.sha256(b"ppfl-mixnet/drbg|" + label + b"|" + seed_bytes).digest()
        self._stream = Cipher(algorithms.ChaCha20(key, _ZERO_NONCE), mode=None).encryptor()
        self._buffer = b""
        self._pos = 0

    def random_bytes(self, n: int) -> bytes:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if self._pos + n > len(self._buffer):
            rest = self._buffer[self._pos :]
            self._buffer = rest + self._stream.update(bytes(max(self._CHUNK, n)))
            self._pos = 0
        out = self._buffer[self._pos : self._pos + n]
        self._pos += n
        return out


# --- X25519 -------------------------------------------------------------------
def private_key_from_bytes(scalar: bytes) -> X25519PrivateKey:
    """X25519 private key from 32 bytes (clamped by X25519 itself)."""
    if len(scalar) != SCALAR_SIZE:
        raise ValueError(f"scalar must be {SCALAR_SIZE} bytes, got {len(scalar)}")
    return X25519PrivateKey.from_private_bytes(scalar)


def public_bytes(key: X25519PrivateKey | X25519PublicKey) -> bytes:
    """Raw 32-byte u-coordinate of a key's public point."""
    pub = key.public_key() if isinstance(key, X25519PrivateKey) else key
    return pub.public_bytes_raw()


def check_point(u: bytes) -> bytes:
    """Check a received group element; returns ``u`` itself.

    RFC 7748 decoding ignores bit 255 and reduces mod p, so two encodings can
    name one point; accepting both would let a flipped bit pass unnoticed.
    Low-order points are caught by :func:`scalarmult` (all-zero result).
    """
    if len(u) != GROUP_ELEMENT_SIZE:
        raise InvalidHeader(f"group element must be {GROUP_ELEMENT_SIZE} bytes, got {len(u)}")
    if int.from_bytes(u, "little") >= CURVE25519_P:
        raise InvalidHeader("non-canonical group element")
    return u


def scalarmult(scalar: bytes, point: bytes) -> bytes:
    """X25519(scalar, point) = ``clamp(scalar) * point`` on raw 32-byte strings (RFC 7748).

    The same function as ``X25519PrivateKey.from_private_bytes(scalar).exchange(point)``,
    one scalar multiplication instead of two. A low-order point (all-zero
    result, refused by libsodium) is an invalid header.
    """
    try:
        return crypto_scalarmult(scalar, point)
    except SodiumRuntimeError as exc:
        raise InvalidHeader("low-order group element") from exc


def scalarmult_base(scalar: bytes) -> bytes:
    """X25519(scalar, 9): the public key of ``scalar``, by libsodium's fixed-base tables."""
    return crypto_scalarmult_base(scalar)


def clamped_scalar(scalar: bytes) -> int:
    """The integer X25519 multiplies by (RFC 7748 ``decodeScalar25519``)."""
    return (int.from_bytes(scalar, "little") & (2**255 - 8)) | 2**254


def scalar_for_x25519(n: int) -> bytes | None:
    """Bytes ``s`` with ``X25519(s, P) == u(n P)`` for every point ``P`` of the curve, or None.

    Lets the sender multiply by a product of clamped scalars (the Sphinx
    paper's ``x b_0 ... b_{i-1}``) through X25519, which clamps: it multiplies
    by ``8 t`` with ``t`` in ``[2^251, 2^252)``. A multiple of 8 removes ``P``'s
    small-order component and ``u(nP) = u(-nP)``, so ``t = +-n / 8 mod L`` works
    when one of the two is in range: for all ``n`` but a fraction ~2^-126, where
    this returns None and the caller blinds step by step. (Not for points of the
    twist: no key made as ``y G`` is one.)
    """
    t = n * _INV8_MOD_L % CURVE25519_L
    if not 2**251 <= t < 2**252:
        t = CURVE25519_L - t
        if not 2**251 <= t < 2**252:
            return None
    return (8 * t).to_bytes(SCALAR_SIZE, "little")


def validate_public_key(raw: bytes) -> bytes:
    """Check a peer's announced X25519 public key before it enters any peer view.

    Rejects a wrong length, a non-canonical encoding (u >= p, as
    :func:`check_point`), and any low-order point (the all-zero key, 1, p - 1,
    the two order-8 points of libsodium's blocklist): with such a key every
    shared secret is all zeros (RFC 7748, Sec. 6.1), so a packet routed through
    it cannot be built. The exchange with a throwaway scalar catches them all,
    since a clamped scalar is a multiple of the cofactor 8.

    Returns
    -------
    bytes
        ``raw`` itself, unchanged.

    Raises
    ------
    InvalidPeerKey
        With what was wrong.
    """
    if len(raw) != GROUP_ELEMENT_SIZE:
        raise InvalidPeerKey(f"public key must be {GROUP_ELEMENT_SIZE} bytes, got {len(raw)}")
    if int.from_bytes(raw, "little") >= CURVE25519_P:
        raise InvalidPeerKey("non-canonical public key (u-coordinate >= 2^255 - 19)")
    try:  # OpenSSL refuses an all-zero shared secret with ValueError
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(raw))
    except ValueError as exc:
        raise InvalidPeerKey("low-order public key (all-zero shared secret)") from exc
    return raw


# --- key derivation -------------------------------------------------------------
class HopKeys(NamedTuple):
    """Everything one hop derives from its shared secret (Sphinx h_rho, h_mu, h_pi, h_b, h_tau)."""

    stream_key: bytes
    mac_key: bytes
    payload_key: bytes  # LIONESS_KEY_SIZE bytes: four round keys
    blinding: bytes
    replay_tag: bytes


def derive_hop_keys(shared_secret: bytes, alpha: bytes) -> HopKeys:
    """HKDF-SHA256(ikm = shared secret, salt = alpha): binds every key to this packet's alpha."""
    okm = HKDF(_SHA256, HOP_KEY_MATERIAL_SIZE, alpha, HKDF_INFO).derive(shared_secret)
    a = STREAM_KEY_SIZE
    b = a + MAC_KEY_SIZE
    c = b + LIONESS_KEY_SIZE
    d = c + BLINDING_FACTOR_SIZE
    return HopKeys(okm[:a], okm[a:b], okm[b:c], okm[c:d], okm[d : d + REPLAY_TAG_SIZE])


def derive_surb_payload_key(seed: bytes) -> bytes:
    """LIONESS key with which a replier encrypts the body it sends on a SURB."""
    return HKDFExpand(_SHA256, LIONESS_KEY_SIZE, SURB_KEY_INFO).derive(seed)


# --- stream cipher and MAC ------------------------------------------------------
def stream_xor(key: bytes, data: bytes) -> bytes:
    """``data XOR ChaCha20(key)``; every key here is used for one message only."""
    return Cipher(algorithms.ChaCha20(key, _ZERO_NONCE), mode=None).encryptor().update(data)


def keystream(key: bytes, n: int) -> bytes:
    return stream_xor(key, bytes(n))


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 over the concatenated parts, truncated to ``MAC_SIZE``."""
    h = hmac.HMAC(key, _SHA256)
    for part in parts:
        h.update(part)
    return h.finalize()[:MAC_SIZE]


def mac_equal(a: bytes, b: bytes) -> bool:
    """Constant-time comparison of two tags."""
    return std_hmac.compare_digest(a, b)


def xor_bytes(a: bytes, b: bytes) -> bytes:
    """XOR of two equal-length short byte strings."""
    n = len(a)
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(n, "little")


# --- LIONESS wide-block cipher ---------------------------------------------------
def _hash(key: bytes, data: bytes) -> bytes:
    h = hmac.HMAC(key, _SHA256)
    h.update(data)
    return h.finalize()


def _split_key(key: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    if len(key) != LIONESS_KEY_SIZE:
        raise ValueError(f"LIONESS key must be {LIONESS_KEY_SIZE} bytes, got {len(key)}")
    s = LIONESS_ROUND_KEY_SIZE
    return key[:s], key[s : 2 * s], key[2 * s : 3 * s], key[3 * s :]


def lioness_encrypt(key: bytes, block: bytes) -> bytes:
    """LIONESS encryption: R ^= S(L^K1); L ^= H_K2(R); R ^= S(L^K3); L ^= H_K4(R).

    Changing any bit of the ciphertext changes every bit of the decryption with
    probability 1/2, which is what lets the destination detect tampering with a
    zero prefix alone.
    """
    k1, k2, k3, k4 = _split_key(key)
    left, right = block[:LIONESS_LEFT_SIZE], block[LIONESS_LEFT_SIZE:]
    if len(left) != LIONESS_LEFT_SIZE or not right:
        raise ValueError(f"LIONESS block must be > {LIONESS_LEFT_SIZE} bytes, got {len(block)}")
    right = stream_xor(xor_bytes(left, k1), right)
    left = xor_bytes(left, _hash(k2, right))
    right = stream_xor(xor_bytes(left, k3), right)
    left = xor_bytes(left, _hash(k4, right))
    return left + right


def lioness_decrypt(key: bytes, block: bytes) -> bytes:
    """Inverse of :func:`lioness_encrypt` (rounds in reverse order)."""
    k1, k2, k3, k4 = _split_key(key)
    left, right = block[:LIONESS_LEFT_SIZE], block[LIONESS_LEFT_SIZE:]
    if len(left) != LIONESS_LEFT_SIZE or not right:
        raise ValueError(f"LIONESS block must be > {LIONESS_LEFT_SIZE} bytes, got {len(block)}")
    left = xor_bytes(left, _hash(k4, right))
    right = stream_xor(xor_bytes(left, k3), right)
    left = xor_bytes(left, _hash(k2, right))
    right = stream_xor(xor_bytes(left, k1), right)
    return left + right
