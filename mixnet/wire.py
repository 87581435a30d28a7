"""Link-level frames: a Sphinx packet or a control message, one type byte first.

    PACKET = 0x01 || Sphinx packet (fmt.packet_size)
    JOIN   = 0x02 || peer record            (announce a node and its key)
    VIEW   = 0x03 || count (2) || records   (bootstrap reply to a joining node)
    PING   = 0x04 || nonce (8)              (connectivity check)
    PONG   = 0x05 || nonce (8)
    LEAVE  = 0x06 || node address (k)       (graceful departure)
    record = node address (k) || public key (32) || identity key (32) || version (8)
             || endpoint length (2) || endpoint (utf-8) || Ed25519 signature (64)

Control frames are not mixed: they are small, infrequent membership traffic.
In network mode the TLS link authenticates who sent a frame; the record's
signature (by the node it describes, :mod:`mixnet.identity`) is what
makes a relayed record trustworthy. Parsing only checks lengths; signatures
are checked where a record enters a view.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .constants import GROUP_ELEMENT_SIZE, NODE_ADDRESS_SIZE, PacketFormat
from .errors import InvalidFrame
from .header import decode_address, encode_address
from .identity import IDENTITY_KEY_SIZE, SIGNATURE_SIZE
from .peers import PeerInfo

FRAME_PACKET = 0x01
FRAME_JOIN = 0x02
FRAME_VIEW = 0x03
FRAME_PING = 0x04
FRAME_PONG = 0x05
FRAME_LEAVE = 0x06
_MAX_ENDPOINT = 255


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    packet: bytes = b""
    peers: tuple[PeerInfo, ...] = ()
    nonce: int = 0
    node_id: int = -1


def _record(info: PeerInfo) -> bytes:
    endpoint = info.endpoint.encode()
    if len(endpoint) > _MAX_ENDPOINT:
        raise ValueError(f"endpoint must be <= {_MAX_ENDPOINT} bytes, got {len(endpoint)}")
    return (encode_address(info.node_id) + info.public_key + info.identity + struct.pack(">Q", info.version)
            + struct.pack(">H", len(endpoint)) + endpoint + info.signature)


def _parse_record(raw: bytes, pos: int) -> tuple[PeerInfo, int]:
    fixed = NODE_ADDRESS_SIZE + GROUP_ELEMENT_SIZE + IDENTITY_KEY_SIZE + 8 + 2
    if len(raw) - pos < fixed:
        raise InvalidFrame("truncated peer record")
    node_id = decode_address(raw[pos : pos + NODE_ADDRESS_SIZE])
    pos += NODE_ADDRESS_SIZE
    key = raw[pos : pos + GROUP_ELEMENT_SIZE]
    pos += GROUP_ELEMENT_SIZE
    identity = raw[pos : pos + IDENTITY_KEY_SIZE]
    pos += IDENTITY_KEY_SIZE
    (version,) = struct.unpack_from(">Q", raw, pos)
    pos += 8
    (n,) = struct.unpack_from(">H", raw, pos)
    pos += 2
    if len(raw) - pos < n + SIGNATURE_SIZE:
        raise InvalidFrame("truncated endpoint or signature")
    try:
        endpoint = raw[pos : pos + n].decode()
    except UnicodeDecodeError as exc:
        raise InvalidFrame("endpoint is not utf-8") from exc
    pos += n
    signature = raw[pos : pos + SIGNATURE_SIZE]
    return PeerInfo(node_id, key, endpoint, identity, version, signature), pos + SIGNATURE_SIZE


def packet_frame(packet: bytes) -> bytes:
    return bytes([FRAME_PACKET]) + packet


def join_frame(info: PeerInfo) -> bytes:
    return bytes([FRAME_JOIN]) + _record(info)


def view_frame(peers: list[PeerInfo]) -> bytes:
    if len(peers) > 0xFFFF:
        raise ValueError(f"at most 65535 peers per VIEW, got {len(peers)}")
    return bytes([FRAME_VIEW]) + struct.pack(">H", len(peers)) + b"".join(_record(p) for p in peers)


def ping_frame(nonce: int) -> bytes:
    return bytes([FRAME_PING]) + struct.pack(">Q", nonce)


def pong_frame(nonce: int) -> bytes:
    return bytes([FRAME_PONG]) + struct.pack(">Q", nonce)


def leave_frame(node_id: int) -> bytes:
    return bytes([FRAME_LEAVE]) + encode_address(node_id)


def decode_frame(fmt: PacketFormat, raw: bytes) -> Frame:
    """Parse a frame; every length is checked before it is read."""
    if not raw:
        raise InvalidFrame("empty frame")
    kind, body = raw[0], bytes(raw[1:])
    if kind == FRAME_PACKET:
        if len(body) != fmt.packet_size:
            raise InvalidFrame(f"packet frame must carry {fmt.packet_size} bytes, got {len(body)}")
        return Frame(kind, packet=body)
    if kind in (FRAME_PING, FRAME_PONG):
        if len(body) != 8:
            raise InvalidFrame("ping/pong nonce must be 8 bytes")
        return Frame(kind, nonce=struct.unpack(">Q", body)[0])
    if kind == FRAME_LEAVE:
        if len(body) != NODE_ADDRESS_SIZE:
            raise InvalidFrame("leave frame must carry one address")
        return Frame(kind, node_id=decode_address(body))
    if kind == FRAME_JOIN:
        info, pos = _parse_record(body, 0)
        if pos != len(body):
            raise InvalidFrame("trailing bytes after JOIN record")
        return Frame(kind, peers=(info,))
    if kind == FRAME_VIEW:
        if len(body) < 2:
            raise InvalidFrame("truncated VIEW count")
        (count,) = struct.unpack_from(">H", body)
        pos, peers = 2, []
        for _ in range(count):
            info, pos = _parse_record(body, pos)
            peers.append(info)
        if pos != len(body):
            raise InvalidFrame("trailing bytes after VIEW records")
        return Frame(kind, peers=tuple(peers))
    raise InvalidFrame(f"unknown frame type {kind:#x}")
