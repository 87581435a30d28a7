"""End-to-end plaintext carried inside a Sphinx body (visible to the destination only).

Three kinds share one fixed-size body, so relays and the network see no difference::

    DATA  = 0x01 || message id (k) || fragment index (4) || fragment count (4)
                 || data length (4) || SURB (fmt.surb_size) || data
    ACK   = 0x02 || message id (k) || fragment index (4)
    COVER = 0x03

A DATA fragment always carries a fresh SURB; the receiver acknowledges each
copy through it, so the sender can retransmit on a fresh route until acked.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .constants import IDENTIFIER_SIZE, PacketFormat
from .errors import InvalidPayload, InvalidSURB
from .surb import SURB

KIND_DATA = 0x01
KIND_ACK = 0x02
KIND_COVER = 0x03
MESSAGE_ID_SIZE = IDENTIFIER_SIZE
_DATA_FIXED = struct.Struct(">B16sIII")
_ACK_FIXED = struct.Struct(">B16sI")
assert _DATA_FIXED.size == 1 + MESSAGE_ID_SIZE + 12


def fragment_capacity(fmt: PacketFormat) -> int:
    """Bytes of application data one DATA fragment carries."""
    cap = fmt.plaintext_size - _DATA_FIXED.size - fmt.surb_size
    if cap < 1:
        raise ValueError(f"payload_size {fmt.payload_size} leaves no room for data next to a SURB")
    return cap


@dataclass(frozen=True, slots=True)
class DataFragment:
    message_id: bytes
    index: int
    count: int
    surb: SURB
    data: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    message_id: bytes
    index: int


@dataclass(frozen=True, slots=True)
class Cover:
    pass


def encode_data(fmt: PacketFormat, fragment: DataFragment) -> bytes:
    if len(fragment.data) > fragment_capacity(fmt):
        raise ValueError(f"fragment data must be <= {fragment_capacity(fmt)} bytes, got {len(fragment.data)}")
    head = _DATA_FIXED.pack(KIND_DATA, fragment.message_id, fragment.index, fragment.count, len(fragment.data))
    return head + fragment.surb.to_bytes() + fragment.data


def encode_ack(ack: Ack) -> bytes:
    return _ACK_FIXED.pack(KIND_ACK, ack.message_id, ack.index)


def encode_cover() -> bytes:
    return bytes([KIND_COVER])


def decode_message(fmt: PacketFormat, plaintext: bytes) -> DataFragment | Ack | Cover:
    """Parse a checked plaintext area; lengths are checked before every read.

    Raises
    ------
    InvalidPayload
        Unknown kind, truncated fields or inconsistent fragment numbering.
    """
    if not plaintext:
        raise InvalidPayload("empty plaintext")
    kind = plaintext[0]
    if kind == KIND_COVER:
        return Cover()
    if kind == KIND_ACK:
        if len(plaintext) < _ACK_FIXED.size:
            raise InvalidPayload("truncated ACK")
        _, message_id, index = _ACK_FIXED.unpack_from(plaintext)
        return Ack(message_id, index)
    if kind != KIND_DATA:
        raise InvalidPayload(f"unknown message kind {kind:#x}")
    if len(plaintext) < _DATA_FIXED.size + fmt.surb_size:
        raise InvalidPayload("truncated DATA header")
    _, message_id, index, count, length = _DATA_FIXED.unpack_from(plaintext)
    if not 0 <= index < count:
        raise InvalidPayload(f"fragment index {index} outside [0, {count})")
    start = _DATA_FIXED.size + fmt.surb_size
    if length > len(plaintext) - start:
        raise InvalidPayload(f"data length {length} exceeds the body")
    try:
        surb = SURB.from_bytes(fmt, plaintext[_DATA_FIXED.size : start])
    except InvalidSURB as exc:  # cannot happen given the length check; keep the type promise
        raise InvalidPayload(str(exc)) from exc
    return DataFragment(message_id, index, count, surb, plaintext[start : start + length])
