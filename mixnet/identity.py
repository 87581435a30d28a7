"""Long-term node identities: Ed25519 keys that sign a node's own peer record.

A peer record binds a node id to its current Sphinx key and endpoint. Only the
node itself can make one: it signs ``node id || Sphinx key || identity key ||
version || endpoint`` with its Ed25519 identity key (RFC 8032, ``cryptography``).
Peers pin the identity key of each node they know, and replace a known node's
record only with a newer one (higher ``version``) signed under that pinned
key, so a record relayed by a third party cannot re-key or re-point a node
(see :meth:`~mixnet.peers.PeerView.add`).

Ed25519 signatures are deterministic, so a seeded simulation (identity keys
from :class:`~mixnet.crypto.SeededRandomSource`) signs the same bytes
on every run.

``version`` = ``epoch << EPOCH_SHIFT | generation``: the epoch grows with each
(re)start of the node (its incarnation in the simulator, the start time in
milliseconds in network mode) and the generation with each Sphinx key rotation.
"""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .constants import GROUP_ELEMENT_SIZE
from .crypto import RandomSource
from .errors import InvalidPeerRecord
from .header import encode_address

IDENTITY_KEY_SIZE = 32  # Ed25519 public key (RFC 8032)
SIGNATURE_SIZE = 64
EPOCH_SHIFT = 20  # generations (key rotations) per epoch: 2^20
RECORD_DOMAIN = b"ppfl-mixnet/peer-record/v1|"
_VERSION = struct.Struct(">Q")


def identity_from_source(source: RandomSource) -> Ed25519PrivateKey:
    """An Ed25519 identity key drawn from ``source`` (seeded in simulation, ``os.urandom`` in deployment)."""
    return Ed25519PrivateKey.from_private_bytes(source.random_bytes(32))


def identity_public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def make_version(epoch: int, generation: int) -> int:
    """Record version of key ``generation`` in ``epoch``; refuses values that would wrap."""
    if not 0 <= generation < 1 << EPOCH_SHIFT:
        raise ValueError(f"generation must be in [0, 2^{EPOCH_SHIFT}), got {generation}")
    if not 0 <= epoch < 1 << (64 - EPOCH_SHIFT):
        raise ValueError(f"epoch must be in [0, 2^{64 - EPOCH_SHIFT}), got {epoch}")
    return epoch << EPOCH_SHIFT | generation


def epoch_of(version: int) -> int:
    return version >> EPOCH_SHIFT


def signed_body(node_id: int, public_key: bytes, identity: bytes, version: int, endpoint: str) -> bytes:
    """The bytes a record's signature covers (domain-separated from every other use of the key)."""
    if len(public_key) != GROUP_ELEMENT_SIZE or len(identity) != IDENTITY_KEY_SIZE:
        raise ValueError(f"public_key and identity must be {GROUP_ELEMENT_SIZE} and {IDENTITY_KEY_SIZE} bytes, "
                         f"got {len(public_key)} and {len(identity)}")
    endpoint_bytes = endpoint.encode()
    return (RECORD_DOMAIN + encode_address(node_id) + public_key + identity + _VERSION.pack(version)
            + struct.pack(">H", len(endpoint_bytes)) + endpoint_bytes)


def sign(key: Ed25519PrivateKey, body: bytes) -> bytes:
    return key.sign(body)


def verify(identity: bytes, signature: bytes, body: bytes) -> None:
    """Check ``signature`` over ``body`` under ``identity``.

    Raises
    ------
    InvalidPeerRecord
        Wrong sizes, a malformed identity key, or a signature that does not verify.
    """
    if len(identity) != IDENTITY_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        raise InvalidPeerRecord(f"identity and signature must be {IDENTITY_KEY_SIZE} and {SIGNATURE_SIZE} bytes, "
                                f"got {len(identity)} and {len(signature)}")
    try:
        Ed25519PublicKey.from_public_bytes(identity).verify(signature, body)
    except (InvalidSignature, ValueError) as exc:
        raise InvalidPeerRecord("peer record signature does not verify under its identity key") from exc
