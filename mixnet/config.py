"""Parameters of the mixnet transport, validated once and passed down as a frozen object.

Paper defaults (UnlinkableDFL): K = 2, O = 100, mu = 0.1 s, sigma = 0.001,
cover traffic on, 10,240-byte bodies.

How ``sigma`` enters: the per-hop hold time is ``Exp(mean=mu)`` (sampled by the
sender and carried in the header, Loopix-style) plus a node-local Gaussian
jitter ``N(0, sigma^2)``, truncated so the total is never negative. The jitter
models processing/scheduling noise; mixing strength comes from the exponential
part, whose memorylessness is what makes Poisson mixing hard to time-correlate.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .constants import DEFAULT_MAX_HOPS, DEFAULT_PAYLOAD_SIZE, PacketFormat
from .peers import DEFAULT_MAX_PEERS
from .replay import DEFAULT_REPLAY_CAPACITY

COVER_POLICIES = ("data", "own", "all")
TRANSPORTS = ("simulation", "network")


@dataclass(frozen=True)
class MixnetConfig:
    """Transport parameters shared by every node.

    Parameters
    ----------
    max_path_length
        ``K``: each packet takes ``k ~ Uniform{1..K}`` hops (or ``path_length_weights``).
    outbox_size
        ``O``: a node releases its outbox in shuffled batches of ``O`` packets.
    mu
        Mean per-hop hold time (exponential), seconds.
    sigma
        SD of the Gaussian jitter added to each hold time, seconds.
    cover_traffic
        Pad batches with cover packets up to ``O``.
    cover_policy
        Which batches are padded: ``"data"`` (default, the paper's outbox of
        outgoing fragments plus cover): batches holding the node's own data
        fragments; ``"own"``: also batches holding only its acknowledgements;
        ``"all"``: every batch, relay-only ones included (strongest, costliest).
    fill_timeout
        Longest wait for an outbox to fill before it is flushed anyway
        (default: ``mu``).
    ack_timeout
        Retransmit a fragment not acknowledged after this long (default: a
        bound on the round trip, ``2 (K + 1) (fill_timeout + 4 mu) + 0.5``).
    max_retries
        Retransmissions per fragment before the message is reported failed.
    payload_size, header_hops
        Packet format: body bytes and the header's hop capacity ``r >= K``.
    replay_capacity
        Tags per replay-cache generation (see :mod:`mixnet.replay`).
    suspicion_threshold
        Missed acks blamed on a peer before it is probed with a connectivity check.
    path_length_weights
        Optional weights of lengths ``1..K``; ``None`` is uniform (the paper's case).
    transport
        ``"simulation"`` (one process, virtual time) or ``"network"`` (one OS
        process per node over TLS on loopback).
    max_peers
        Most records one peer view holds (self included); beyond it a dead peer
        is forgotten, or the new record refused.
    partial_max_messages, partial_max_fragments, partial_ttl
        Receiver reassembly bounds: incomplete messages held at once (the
        oldest is evicted), fragments per message (larger counts are refused,
        and ``send`` refuses larger messages), and seconds an incomplete
        message (and a completed id, for deduplication) is kept (default: twice
        the sender's retransmission window, ``2 (max_retries + 1) ack_timeout``).
    key_rotation
        Rotate the node's Sphinx key at each replay-cache generation swap, so a
        packet older than the replay window can no longer be processed at all.
    key_grace_period
        Seconds a rotated-out key still processes packets built before the
        peers learned the new one (default ``2 ack_timeout``; never past the
        next generation swap).
    """

    max_path_length: int = 2
    outbox_size: int = 100
    mu: float = 0.1
    sigma: float = 0.001
    cover_traffic: bool = True
    cover_policy: str = "data"
    fill_timeout: float | None = None
    ack_timeout: float | None = None
    max_retries: int = 5
    payload_size: int = DEFAULT_PAYLOAD_SIZE
    header_hops: int = DEFAULT_MAX_HOPS
    replay_capacity: int = DEFAULT_REPLAY_CAPACITY
    suspicion_threshold: int = 2
    path_length_weights: tuple[float, ...] | None = None
    transport: str = "simulation"
    max_peers: int = DEFAULT_MAX_PEERS
    partial_max_messages: int = 64
    partial_max_fragments: int = 256
    partial_ttl: float | None = None
    key_rotation: bool = True
    key_grace_period: float | None = None

    def __post_init__(self) -> None:
        def require(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {expected}, got {getattr(self, name)!r}")

        require(isinstance(self.max_path_length, int) and self.max_path_length >= 1, "max_path_length", "an int >= 1")
        require(isinstance(self.header_hops, int) and self.header_hops >= self.max_path_length,
                "header_hops", f">= max_path_length ({self.max_path_length})")
        require(isinstance(self.outbox_size, int) and self.outbox_size >= 1, "outbox_size", "an int >= 1")
        # mu = 0 is refused, not read as "no delay": the hold time Exp(mu) is what hides which input
        # left as which output (and the adversary's timing model divides by mu). The study's "mixnet
        # off" transport uses K = 1, O = 1, mu = 1e-3 for a near-zero delay instead.
        require(isinstance(self.mu, (int, float)) and math.isfinite(self.mu) and self.mu > 0, "mu",
                "a finite number > 0 seconds (mu = 0 would remove the Poisson mixing delay; use a small "
                "value such as 1e-3 for a near-immediate release)")
        require(math.isfinite(self.sigma) and self.sigma >= 0, "sigma", "a finite number >= 0")
        require(self.cover_policy in COVER_POLICIES, "cover_policy", f"one of {COVER_POLICIES}")
        require(self.fill_timeout is None or (math.isfinite(self.fill_timeout) and self.fill_timeout >= 0),
                "fill_timeout", "None or a finite number >= 0")
        require(self.ack_timeout is None or (math.isfinite(self.ack_timeout) and self.ack_timeout > 0),
                "ack_timeout", "None or a finite number > 0")
        require(isinstance(self.max_retries, int) and self.max_retries >= 0, "max_retries", "an int >= 0")
        require(isinstance(self.replay_capacity, int) and self.replay_capacity >= 1, "replay_capacity", "an int >= 1")
        require(isinstance(self.suspicion_threshold, int) and self.suspicion_threshold >= 1,
                "suspicion_threshold", "an int >= 1")
        require(self.transport in TRANSPORTS, "transport", f"one of {TRANSPORTS}")
        require(isinstance(self.max_peers, int) and self.max_peers >= 2, "max_peers", "an int >= 2")
        require(isinstance(self.partial_max_messages, int) and self.partial_max_messages >= 1,
                "partial_max_messages", "an int >= 1")
        require(isinstance(self.partial_max_fragments, int) and self.partial_max_fragments >= 1,
                "partial_max_fragments", "an int >= 1")
        require(self.partial_ttl is None or (math.isfinite(self.partial_ttl) and self.partial_ttl > 0),
                "partial_ttl", "None or a finite number > 0 seconds")
        require(isinstance(self.key_rotation, bool), "key_rotation", "a bool")
        require(self.key_grace_period is None
                or (math.isfinite(self.key_grace_period) and self.key_grace_period >= 0),
                "key_grace_period", "None or a finite number >= 0 seconds")
        if self.path_length_weights is not None:
            w = tuple(float(x) for x in self.path_length_weights)
            require(len(w) == self.max_path_length and all(x >= 0 and math.isfinite(x) for x in w) and sum(w) > 0,
                    "path_length_weights", f"{self.max_path_length} finite weights >= 0 with a positive sum")
            object.__setattr__(self, "path_length_weights", w)
        PacketFormat(self.header_hops, self.payload_size)  # validates payload_size
        if not self.cover_traffic and self.outbox_size > 1:
            warnings.warn("cover_traffic is off: partially filled batches hide fewer than O packets", stacklevel=3)

    @property
    def packet_format(self) -> PacketFormat:
        return PacketFormat(self.header_hops, self.payload_size)

    @property
    def effective_fill_timeout(self) -> float:
        return self.mu if self.fill_timeout is None else self.fill_timeout

    @property
    def effective_ack_timeout(self) -> float:
        if self.ack_timeout is not None:
            return self.ack_timeout
        return 2 * (self.max_path_length + 1) * (self.effective_fill_timeout + 4 * self.mu) + 0.5

    @property
    def effective_partial_ttl(self) -> float:
        if self.partial_ttl is not None:
            return self.partial_ttl
        return 2 * (self.max_retries + 1) * self.effective_ack_timeout

    @property
    def effective_key_grace_period(self) -> float:
        return 2 * self.effective_ack_timeout if self.key_grace_period is None else self.key_grace_period

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> MixnetConfig:
        """Build from run-config style keys (``"max-path-length"`` or ``max_path_length``)."""
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ValueError(f"unknown mixnet config key {key!r}; expected one of {sorted(known)}")
            kwargs[name] = tuple(value) if name == "path_length_weights" and value is not None else value
        return cls(**kwargs)
