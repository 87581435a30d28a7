"""Single-Use Reply Blocks (Sphinx Sec. 3.5).

The creator builds a header for a return path ending at itself, with a fresh
SURB id as the final identifier, and keeps every hop's payload key. The replier
gets ``(first hop, header, key seed)``: it encrypts the reply body under the
seed's key and sends ``header || body`` to the first hop, learning nothing about
the path or the creator. Each relay removes one LIONESS layer as usual; the
creator re-applies those layers, removes the replier's, and checks the zero prefix.

Single use is enforced three times: the replier's :class:`SURBGuard` refuses a
second use; a resend of the same header reproduces the first hop's shared secret
and is dropped as a replay; the creator's :class:`SURBStore` forgets a SURB once
a reply has been opened.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from .constants import IDENTIFIER_SIZE, NODE_ADDRESS_SIZE, SURB_KEY_SEED_SIZE, PacketFormat
from .crypto import RandomSource, derive_surb_payload_key, lioness_decrypt, lioness_encrypt
from .errors import InvalidPayload, InvalidSURB
from .header import Hop, build_header, decode_address, encode_address
from .payload import check_body, pad_plaintext
from .replay import DEFAULT_REPLAY_CAPACITY, ReplayCache


@dataclass(frozen=True, slots=True)
class SURB:
    """What the replier holds: enough to send one reply, nothing about the path."""

    first_hop: int
    header: bytes
    key_seed: bytes

    def to_bytes(self) -> bytes:
        return encode_address(self.first_hop) + self.header + self.key_seed

    @classmethod
    def from_bytes(cls, fmt: PacketFormat, raw: bytes) -> SURB:
        """Parse a serialized SURB; the length is checked first."""
        if len(raw) != fmt.surb_size:
            raise InvalidSURB(f"SURB must be {fmt.surb_size} bytes, got {len(raw)}")
        raw = bytes(raw)
        header_end = NODE_ADDRESS_SIZE + fmt.header_size
        return cls(decode_address(raw[:NODE_ADDRESS_SIZE]), raw[NODE_ADDRESS_SIZE:header_end], raw[header_end:])

    @property
    def digest(self) -> bytes:
        """Stable identity of this SURB, for single-use bookkeeping."""
        return hashlib.sha256(self.to_bytes()).digest()[:16]


@dataclass(frozen=True, slots=True)
class SURBSecret:
    """What the creator keeps to open the reply."""

    surb_id: bytes
    hop_payload_keys: tuple[bytes, ...]
    reply_key: bytes


def create_surb(
    fmt: PacketFormat, route: Sequence[Hop], delays: Sequence[float], rng: RandomSource
) -> tuple[SURB, SURBSecret]:
    """SURB for a return path ``route`` whose last hop is the creator itself."""
    surb_id = rng.random_bytes(IDENTIFIER_SIZE)
    if not any(surb_id):  # the all-zero identifier means "forward message"
        surb_id = b"\x01" + surb_id[1:]
    header, keys = build_header(fmt, route, delays, surb_id, rng)
    seed = rng.random_bytes(SURB_KEY_SEED_SIZE)
    secret = SURBSecret(surb_id, tuple(k.payload_key for k in keys), derive_surb_payload_key(seed))
    return SURB(route[0].address, header, seed), secret


def reply_packet(fmt: PacketFormat, surb: SURB, plaintext: bytes) -> bytes:
    """Reply packet built from ``surb`` (send it to ``surb.first_hop``). Pure: no single-use check."""
    if len(surb.header) != fmt.header_size or len(surb.key_seed) != SURB_KEY_SEED_SIZE:
        raise InvalidSURB("SURB fields have the wrong length")
    body = lioness_encrypt(derive_surb_payload_key(surb.key_seed), pad_plaintext(fmt, plaintext))
    return surb.header + body


def open_reply(fmt: PacketFormat, secret: SURBSecret, body: bytes) -> bytes:
    """Creator side: undo the relays' layers and the replier's, then check the zero prefix.

    ``body`` is what :func:`~mixnet.packet.process_packet` returned in
    :class:`~mixnet.packet.Reply`: the creator's own layer is already removed.
    """
    if len(body) != fmt.payload_size:
        raise InvalidPayload(f"body must be {fmt.payload_size} bytes, got {len(body)}")
    for key in reversed(secret.hop_payload_keys):
        body = lioness_encrypt(key, body)
    return check_body(fmt, lioness_decrypt(secret.reply_key, body))


class SURBStore:
    """Creator side: SURBs awaiting their reply, each opened at most once."""

    def __init__(self) -> None:
        self._secrets: dict[bytes, SURBSecret] = {}

    def register(self, secret: SURBSecret) -> None:
        self._secrets[secret.surb_id] = secret

    def discard(self, surb_id: bytes) -> None:
        self._secrets.pop(surb_id, None)

    def __contains__(self, surb_id: bytes) -> bool:
        return surb_id in self._secrets

    def __len__(self) -> int:
        return len(self._secrets)

    def open(self, fmt: PacketFormat, surb_id: bytes, body: bytes) -> bytes:
        """Open a reply and forget the SURB. Unknown or already-used ids raise InvalidSURB."""
        secret = self._secrets.get(surb_id)
        if secret is None:
            raise InvalidSURB("unknown or already used SURB id")
        plaintext = open_reply(fmt, secret, body)  # a tampered reply leaves the SURB usable
        del self._secrets[surb_id]
        return plaintext


class SURBGuard:
    """Replier side: refuse to send a second reply on the same SURB.

    Remembers SURB digests in a bounded two-generation set (see
    :mod:`mixnet.replay`); beyond that window the first hop's replay
    cache still drops the duplicate.
    """

    def __init__(self, capacity: int = DEFAULT_REPLAY_CAPACITY) -> None:
        self._used = ReplayCache(capacity)

    def use(self, fmt: PacketFormat, surb: SURB, plaintext: bytes) -> bytes:
        """Reply packet for ``surb``; raises InvalidSURB if it was used before."""
        packet = reply_packet(fmt, surb, plaintext)
        if self._used.check_and_add(surb.digest):
            raise InvalidSURB("SURB already used")
        return packet
