"""Per-node counters: what each node sent (by kind), received, dropped and spent."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: Transmission kinds. ``real``: first copy of an own data fragment;
#: ``retransmission``: later copies; ``ack``: SURB replies; ``cover``: cover
#: packets; ``relay``: packets forwarded for others; ``control``: JOIN/VIEW/PING/PONG/LEAVE.
TX_KINDS: tuple[str, ...] = ("real", "retransmission", "ack", "cover", "relay", "control")


def _zeros() -> dict[str, int]:
    return dict.fromkeys(TX_KINDS, 0)


@dataclass
class NodeStats:
    """Counters of one node; ``cpu_time_s`` is process time spent in its handlers."""

    packets_sent: dict[str, int] = field(default_factory=_zeros)
    bytes_sent: dict[str, int] = field(default_factory=_zeros)
    packets_received: int = 0
    bytes_received: int = 0
    cpu_time_s: float = 0.0
    relayed: int = 0
    dropped_tampered: int = 0
    dropped_replay: int = 0
    dropped_invalid: int = 0
    dropped_bad_key: int = 0  # peer records (JOIN / VIEW / directory) with a bad X25519 key
    dropped_bad_signature: int = 0  # peer records whose Ed25519 signature does not verify
    dropped_hijack: int = 0  # records re-keying a known node under another identity, from a third party
    dropped_stale_record: int = 0  # records not newer than the stored one (a rollback or a late flood copy)
    dropped_unsolicited_view: int = 0  # VIEW frames from a peer we had not sent a JOIN to
    dropped_view_full: int = 0  # new peers refused: the view held max_peers records, all routable
    peers_evicted: int = 0  # dead peers forgotten to make room for a new one
    dropped_oversized_message: int = 0  # fragments announcing more than partial_max_fragments fragments
    partials_evicted: int = 0  # incomplete messages evicted (oldest first) beyond partial_max_messages
    partials_expired: int = 0  # incomplete messages dropped after partial_ttl
    key_rotations: int = 0  # Sphinx key rotations (one per replay-cache generation swap)
    previous_key_packets: int = 0  # packets processed with the rotated-out key during its grace period
    cover_received: int = 0
    fragments_received: int = 0
    duplicate_fragments: int = 0
    delivered_messages: int = 0
    acks_received: int = 0
    duplicate_acks: int = 0
    failed_messages: int = 0
    connectivity_checks: int = 0
    link_failures: int = 0
    peers_removed: int = 0

    def record_tx(self, kind: str, nbytes: int) -> None:
        self.packets_sent[kind] += 1
        self.bytes_sent[kind] += nbytes

    @property
    def total_packets_sent(self) -> int:
        return sum(self.packets_sent.values())

    @property
    def total_bytes_sent(self) -> int:
        return sum(self.bytes_sent.values())

    def as_dict(self) -> dict:
        out = asdict(self)
        out["total_packets_sent"] = self.total_packets_sent
        out["total_bytes_sent"] = self.total_bytes_sent
        return out

    @classmethod
    def from_dict(cls, values: dict) -> NodeStats:
        values = {k: v for k, v in values.items() if not k.startswith("total_")}
        return cls(**values)
