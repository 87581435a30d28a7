"""Mixnet transport of the UnlinkableDFL study: real Sphinx packets, mixing, SURB acks.

Layers, bottom up (one module each): ``constants`` (sizes from one security
parameter), ``crypto`` (``cryptography`` wrappers, LIONESS), ``header`` /
``payload`` / ``packet`` / ``surb`` (Sphinx), ``replay`` / ``keyring`` (replay
window, key rotation), ``identity`` (signed peer records), ``routing`` /
``topology`` / ``peers``, ``outbox`` (mixing), ``messages`` / ``delivery``
(fragments, acks, exactly-once), ``node`` (one peer, no I/O), ``simulator``
(virtual time, adversary trace), ``net_*`` (one process per node over TLS),
``metrics`` (entropy, min-entropy), ``theory`` (our chain-following gamma_T and bound on
the passive adversary's linking advantage), ``theory_multiplicity`` (the multiplicity form
of gamma_T, issue 39's reading of the paper). See ``docs/mixnet.md``.

Where it sits: a shared package beside ``privacy`` (its own package because it is an
asyncio/TLS transport, not the pure math ``privacy`` holds). Arrows point one way:
``flower_apps`` and ``attacks`` (the linking attacks read its ``AdversaryView``) import
``mixnet``; ``mixnet`` imports only ``registry`` (its topologies) and may import ``privacy``'s
pure math, and ``privacy`` never imports ``mixnet`` (tests/test_import_graph.py checks both).
"""

from .config import MixnetConfig
from .constants import PacketFormat
from .delivery import DeliveredMessage
from .errors import (
    InvalidFrame,
    InvalidHeader,
    InvalidPacket,
    InvalidPayload,
    InvalidPeerKey,
    InvalidPeerRecord,
    InvalidSURB,
    MixnetError,
    ReplayDetected,
)
from .messages import fragment_capacity
from .metrics import h_path, h_relay, relay_mapping_entropy
from .node import MixNode
from .simulator import Simulator
from .stats import NodeStats
from .trace import AdversaryView, GroundTruth, TraceRecord
from .transport import create_transport

__all__ = [
    "AdversaryView",
    "DeliveredMessage",
    "GroundTruth",
    "InvalidFrame",
    "InvalidHeader",
    "InvalidPacket",
    "InvalidPayload",
    "InvalidPeerKey",
    "InvalidPeerRecord",
    "InvalidSURB",
    "MixNode",
    "MixnetConfig",
    "MixnetError",
    "NodeStats",
    "PacketFormat",
    "ReplayDetected",
    "Simulator",
    "TraceRecord",
    "create_transport",
    "fragment_capacity",
    "h_path",
    "h_relay",
    "relay_mapping_entropy",
]
