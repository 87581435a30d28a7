"""One peer: learner-facing sender/receiver and mix relay, with no I/O of its own.

The same :class:`MixNode` runs in the discrete-event simulator and in the
one-process-per-node network mode; only the :class:`NodeEnvironment` (clock,
timers, links) differs. Every Sphinx packet it receives is processed with its
own private key by :func:`~mixnet.packet.process_packet`, through its
:class:`~mixnet.keyring.SphinxKeyring` (rotated at each replay-cache
generation swap). Peer records are signed by the node they describe and
checked where they enter the view (:mod:`mixnet.peers`).
"""

from __future__ import annotations

import random
from functools import partial

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from . import wire
from .config import MixnetConfig
from .crypto import RandomSource, private_key_from_bytes, public_bytes
from .delivery import DeliveredMessage, OutgoingMessage, PendingFragment, Reassembler
from .environment import Cancellable, NodeEnvironment, TxMeta  # re-exported
from .errors import (
    InvalidFrame,
    InvalidHeader,
    InvalidPacket,
    InvalidPayload,
    InvalidPeerKey,
    InvalidPeerRecord,
    InvalidSURB,
    ReplayDetected,
)
from .identity import epoch_of, make_version
from .keyring import SphinxKeyring
from .messages import (
    MESSAGE_ID_SIZE,
    Ack,
    Cover,
    DataFragment,
    decode_message,
    encode_ack,
    encode_cover,
    encode_data,
    fragment_capacity,
)
from .outbox import Outbox, OutboxItem, mix_batch, release_delays
from .packet import Deliver, Forward, Reply, create_packet
from .peers import Authority, Outcome, PeerInfo, PeerView
from .replay import ReplayCache
from .routing import sample_delays, sample_route
from .stats import NodeStats
from .surb import SURBGuard, SURBStore, create_surb


class MixNode:
    """A peer of the UnlinkableDFL mixnet.

    Parameters
    ----------
    node_id
        This node's address.
    private_key
        Its first Sphinx X25519 key.
    config
        Shared transport parameters.
    env
        Host environment (simulator or asyncio network loop).
    rng
        Seeded generator for routes, delays and shuffles.
    crypto_rng
        Source of ephemeral keys, SURB ids, padding and rotated Sphinx keys (seeded only in simulation).
    identity_key
        Its long-term Ed25519 key, which signs its peer records.
    endpoint
        Its ``host:port`` (network mode).
    epoch
        Grows with each (re)start of the node id, so its new records supersede the old ones.
    """

    def __init__(
        self,
        node_id: int,
        private_key: X25519PrivateKey,
        config: MixnetConfig,
        env: NodeEnvironment,
        *,
        rng: random.Random,
        crypto_rng: RandomSource,
        identity_key: Ed25519PrivateKey,
        endpoint: str = "",
        epoch: int = 0,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.fmt = config.packet_format
        self.env = env
        self.rng = rng
        self.crypto_rng = crypto_rng
        self._identity = identity_key
        self._epoch = epoch
        self.info = PeerInfo.signed(identity_key, node_id, public_bytes(private_key), endpoint, make_version(epoch, 0))
        self.view = PeerView(self.info, config.max_peers)
        self.replay_cache = ReplayCache(config.replay_capacity)
        self.keyring = SphinxKeyring(private_key, self.replay_cache)
        self.surbs = SURBStore()
        self.surb_guard = SURBGuard(config.replay_capacity)
        self.outbox = Outbox(config.outbox_size)
        self.stats = NodeStats()
        self.inbox: list[DeliveredMessage] = []
        self.alive = True
        self._capacity = fragment_capacity(self.fmt)
        self._fill_timer: Cancellable | None = None
        self._pending: dict[tuple[bytes, int], PendingFragment] = {}
        self._surb_owner: dict[bytes, tuple[bytes, int]] = {}
        self._outgoing: dict[bytes, OutgoingMessage] = {}
        self._reassembler = Reassembler(config.partial_max_messages, config.partial_max_fragments,
                                        config.effective_partial_ttl)
        self._awaiting_view: set[int] = set()  # bootstrap peers sent a JOIN whose VIEW reply is still due
        self._retired_surbs = ReplayCache(config.replay_capacity)
        self._ping_nonce = 0

    # ------------------------------------------------------------------ API --
    def send(self, dst: int, data: bytes) -> bytes:
        """Queue ``data`` for ``dst``; returns the message id. Fragments, routes and SURBs are drawn here."""
        if dst == self.node_id:
            raise ValueError(f"dst must differ from the sender ({self.node_id})")
        if self.view.get(dst) is None:
            raise ValueError(f"dst {dst} is not in the peer view of node {self.node_id}")
        chunks = [data[i : i + self._capacity] for i in range(0, len(data), self._capacity)] or [b""]
        if len(chunks) > self.config.partial_max_fragments:  # the receiver would refuse it
            raise ValueError(f"data must fit in partial_max_fragments = {self.config.partial_max_fragments} fragments "
                             f"of {self._capacity} bytes, got {len(data)} bytes ({len(chunks)} fragments)")
        message_id = self.crypto_rng.random_bytes(MESSAGE_ID_SIZE)
        self._outgoing[message_id] = OutgoingMessage(dst, len(chunks))
        for index, chunk in enumerate(chunks):
            fragment = PendingFragment(dst, message_id, index, len(chunks), chunk)
            self._pending[fragment.key] = fragment
            self._send_fragment(fragment, "real")
        return message_id

    def add_peer(self, info: PeerInfo, authority: Authority = Authority.DIRECTORY) -> bool | None:
        """Learn a peer record; by default from the operator's bootstrap directory (trusted to pin identities).

        A refused record returns None and is counted: ``dropped_bad_key``,
        ``dropped_bad_signature``, ``dropped_hijack``, ``dropped_stale_record`` or
        ``dropped_view_full``. Otherwise returns whether the view changed.
        """
        outcome = self._learn(info, authority)
        return None if outcome is None else outcome.changed

    def _learn(self, info: PeerInfo, authority: Authority) -> Outcome | None:
        try:
            outcome = self.view.add(info, authority)
        except InvalidPeerKey:
            self.stats.dropped_bad_key += 1
            return None
        except InvalidPeerRecord:
            self.stats.dropped_bad_signature += 1
            return None
        finally:
            self.stats.peers_evicted = self.view.evicted
        if outcome is Outcome.HIJACK:
            self.stats.dropped_hijack += 1
        elif outcome is Outcome.STALE:
            self.stats.dropped_stale_record += 1
        elif outcome is Outcome.FULL:
            self.stats.dropped_view_full += 1
        return outcome if outcome.accepted else None

    def join(self, bootstrap: list[PeerInfo]) -> None:
        """Enter the network: learn the bootstrap peers and announce ourselves to them."""
        for info in bootstrap:
            if self.add_peer(info) is not None:
                self._awaiting_view.add(info.node_id)
                self._control(info.node_id, wire.join_frame(self.info))

    def leave(self) -> None:
        """Graceful departure: tell the live peers, then stop."""
        for peer in self.view.routable():
            self._control(peer, wire.leave_frame(self.node_id))
        self.alive = False

    @property
    def pending_fragments(self) -> int:
        return len(self._pending)

    @property
    def partial_messages(self) -> int:
        """Incomplete messages held for reassembly (at most ``config.partial_max_messages``)."""
        return self._reassembler.partial_messages

    # ------------------------------------------------------------ transport --
    def on_frame(self, from_peer: int, frame: bytes, ref: object = None) -> None:
        """A frame arrived over the (authenticated) link from ``from_peer``."""
        if not self.alive:
            return
        self.stats.packets_received += 1
        self.stats.bytes_received += len(frame)
        self.view.mark_alive(from_peer)
        try:
            parsed = wire.decode_frame(self.fmt, frame)
        except InvalidFrame:
            self.stats.dropped_invalid += 1
            return
        if parsed.kind == wire.FRAME_PACKET:
            self._on_packet(parsed.packet, ref)
        elif parsed.kind == wire.FRAME_JOIN:
            self._on_join(from_peer, parsed.peers[0])
        elif parsed.kind == wire.FRAME_VIEW:
            if from_peer not in self._awaiting_view:  # only the reply to our own JOIN is read
                self.stats.dropped_unsolicited_view += 1
                return
            self._awaiting_view.discard(from_peer)
            for info in parsed.peers:  # a bad record is dropped alone; the good ones are kept
                self._learn(info, self._authority(from_peer, info))
        elif parsed.kind == wire.FRAME_PING:
            self._control(from_peer, wire.pong_frame(parsed.nonce))
        elif parsed.kind == wire.FRAME_PONG:
            self.view.absolve(from_peer)
        elif parsed.kind == wire.FRAME_LEAVE and parsed.node_id == from_peer:
            if self.view.remove(from_peer):
                self.stats.peers_removed += 1

    def on_link_failure(self, peer: int) -> None:
        """The link to ``peer`` could not be used (connection refused/reset): stop routing via it."""
        if not self.alive:
            return
        self.stats.link_failures += 1
        if self.view.remove(peer):
            self.stats.peers_removed += 1

    # -------------------------------------------------------------- receive --
    def _on_packet(self, packet: bytes, ref: object) -> None:
        try:
            result, used_previous = self.keyring.process(self.fmt, packet, self.env.now())
        except ReplayDetected:
            self.stats.dropped_replay += 1
            return
        except (InvalidPacket, InvalidHeader, InvalidPayload):
            self.stats.dropped_tampered += 1
            return
        finally:  # a tag that opened a new replay-cache generation rotates the key, whatever the packet was
            if self.config.key_rotation and self.keyring.rotation_due():
                self._rotate_key()
        self.stats.previous_key_packets += used_previous
        if isinstance(result, Forward):
            self.stats.relayed += 1
            self._enqueue(OutboxItem(result.next_hop, result.packet, "relay", result.delay, ref))
            return
        try:
            if isinstance(result, Reply):
                message = decode_message(self.fmt, self.surbs.open(self.fmt, result.surb_id, result.body))
            else:
                assert isinstance(result, Deliver)
                message = decode_message(self.fmt, result.plaintext)
        except InvalidPayload:
            self.stats.dropped_tampered += 1
            return
        except InvalidSURB:
            if isinstance(result, Reply) and self._retired_surbs.seen(result.surb_id):
                self.stats.duplicate_acks += 1  # late ack of a copy whose twin was acked first
            else:
                self.stats.dropped_invalid += 1
            return
        if isinstance(message, Cover):
            self.stats.cover_received += 1
        elif isinstance(message, DataFragment) and isinstance(result, Deliver):
            self._on_data(message)
        elif isinstance(message, Ack) and isinstance(result, Reply):
            self._on_ack(result.surb_id, message)
        else:
            self.stats.dropped_invalid += 1

    def _on_data(self, fragment: DataFragment) -> None:
        self.stats.fragments_received += 1
        try:  # acknowledge every copy: the ack of an earlier copy may have been lost
            ack = self.surb_guard.use(self.fmt, fragment.surb, encode_ack(Ack(fragment.message_id, fragment.index)))
            self._enqueue(OutboxItem(fragment.surb.first_hop, ack, "ack", message_id=fragment.message_id))
        except InvalidSURB:
            self.stats.dropped_invalid += 1
        reassembler = self._reassembler
        status, data = reassembler.add(fragment.message_id, fragment.index, fragment.count, fragment.data,
                                       self.env.now())
        self.stats.partials_expired, self.stats.partials_evicted = reassembler.expired, reassembler.evicted
        if status == "duplicate":
            self.stats.duplicate_fragments += 1
        elif status == "inconsistent":
            self.stats.dropped_invalid += 1
        elif status == "oversized":
            self.stats.dropped_oversized_message += 1
        elif status == "complete":
            assert data is not None
            message = DeliveredMessage(fragment.message_id, data, self.env.now())
            self.inbox.append(message)
            self.stats.delivered_messages += 1
            self.env.on_delivered(self.node_id, message)

    def _on_ack(self, surb_id: bytes, ack: Ack) -> None:
        key = self._surb_owner.pop(surb_id, None)
        if key != (ack.message_id, ack.index):
            self.stats.dropped_invalid += 1
            return
        fragment = self._pending.pop(key, None)
        if fragment is None:  # an earlier copy was already acknowledged
            self.stats.duplicate_acks += 1
            return
        self.stats.acks_received += 1
        if fragment.timer is not None:
            fragment.timer.cancel()
        for node in fragment.surbs.get(surb_id, ()):
            self.view.absolve(node)
        for other in fragment.surbs:
            self._surb_owner.pop(other, None)
            self.surbs.discard(other)
            self._retired_surbs.check_and_add(other)
        outgoing = self._outgoing[fragment.message_id]
        outgoing.remaining -= 1
        if outgoing.remaining == 0 and not outgoing.failed:
            del self._outgoing[fragment.message_id]
            self.env.on_acked(self.node_id, fragment.message_id)

    @staticmethod
    def _authority(from_peer: int, info: PeerInfo) -> Authority:
        """A record about the link's own (authenticated) sender speaks for itself; any other is relayed."""
        return Authority.SELF if from_peer == info.node_id else Authority.RELAYED

    def _on_join(self, from_peer: int, info: PeerInfo) -> None:
        old = self.view.get(info.node_id)
        outcome = self._learn(info, self._authority(from_peer, info))
        if outcome is None:  # refused: neither stored, answered nor flooded
            return
        rotation = (outcome is Outcome.UPDATED and old is not None and old.identity == info.identity
                    and epoch_of(old.version) == epoch_of(info.version))
        if from_peer == info.node_id and not rotation:  # direct request: hand over our view
            self._control(from_peer, wire.view_frame([self.info, *self._live_infos()]))
        if outcome.changed:  # flood the announcement once through our view
            for peer in self.view.routable():
                if peer not in (from_peer, info.node_id):
                    self._control(peer, wire.join_frame(info))

    # ----------------------------------------------------------------- send --
    def _send_fragment(self, fragment: PendingFragment, kind: str) -> None:
        cfg = self.config
        live = self.view.routable()
        route = sample_route(live, self.node_id, fragment.dst, cfg.max_path_length, self.rng, cfg.path_length_weights)
        back = sample_route(live, fragment.dst, self.node_id, cfg.max_path_length, self.rng, cfg.path_length_weights)
        surb, secret = create_surb(
            self.fmt, [self.view.hop(n) for n in back], sample_delays(len(back) - 1, cfg.mu, self.rng), self.crypto_rng
        )
        self.surbs.register(secret)
        self._surb_owner[secret.surb_id] = fragment.key
        fragment.surbs[secret.surb_id] = tuple(route) + tuple(back[:-1])
        plaintext = encode_data(
            self.fmt, DataFragment(fragment.message_id, fragment.index, fragment.count, surb, fragment.data)
        )
        packet = create_packet(
            self.fmt, [self.view.hop(n) for n in route], sample_delays(len(route) - 1, cfg.mu, self.rng),
            plaintext, self.crypto_rng,
        )
        self._enqueue(OutboxItem(route[0], packet, kind, message_id=fragment.message_id))
        fragment.timer = self.env.call_later(
            cfg.effective_ack_timeout, partial(self._on_ack_timeout, fragment.key, fragment.attempt)
        )

    def _on_ack_timeout(self, key: tuple[bytes, int], attempt: int) -> None:
        fragment = self._pending.get(key)
        if not self.alive or fragment is None or fragment.attempt != attempt:
            return
        last_path = list(fragment.surbs.values())[-1]
        for node in dict.fromkeys(last_path):
            if node != self.node_id and self.view.blame(node) >= self.config.suspicion_threshold:
                self._connectivity_check(node)
        if fragment.attempt >= self.config.max_retries:
            self._fail(fragment)
            return
        fragment.attempt += 1
        self._send_fragment(fragment, "retransmission")

    def _fail(self, fragment: PendingFragment) -> None:
        for surb_id in fragment.surbs:
            self._surb_owner.pop(surb_id, None)
            self.surbs.discard(surb_id)
        self._pending.pop(fragment.key, None)
        outgoing = self._outgoing.get(fragment.message_id)
        if outgoing is not None and not outgoing.failed:
            outgoing.failed = True
            self.stats.failed_messages += 1
            self.env.on_failed(self.node_id, fragment.message_id)

    def _rotate_key(self) -> None:
        """New Sphinx key at a replay-cache generation swap, announced in a newer signed record."""
        new_key = private_key_from_bytes(self.crypto_rng.random_bytes(32))
        self.keyring.rotate(new_key, self.env.now(), self.config.effective_key_grace_period)
        self.info = PeerInfo.signed(self._identity, self.node_id, public_bytes(new_key), self.info.endpoint,
                                    make_version(self._epoch, self.keyring.generation))
        self.view.set_self(self.info)
        self.stats.key_rotations += 1
        for peer in self.view.routable():
            self._control(peer, wire.join_frame(self.info))

    def _connectivity_check(self, peer: int) -> None:
        self.stats.connectivity_checks += 1
        self._ping_nonce += 1
        self._control(peer, wire.ping_frame(self._ping_nonce))

    def _control(self, peer: int, frame: bytes) -> None:
        self.stats.record_tx("control", len(frame))
        self.env.transmit(self.node_id, peer, frame, TxMeta("control"))

    def _live_infos(self) -> list[PeerInfo]:
        return [info for info in self.view.known() if self.view.is_alive(info.node_id)]

    # --------------------------------------------------------------- mixing --
    def _enqueue(self, item: OutboxItem) -> None:
        self.outbox.push(item)
        if self.outbox.full:
            self._flush()
        elif self._fill_timer is None:
            self._fill_timer = self.env.call_later(self.config.effective_fill_timeout, self._on_fill_timeout)

    def _on_fill_timeout(self) -> None:
        self._fill_timer = None
        if self.alive:
            self._flush()

    def _flush(self) -> None:
        cfg = self.config
        while len(self.outbox):
            batch = self.outbox.take_batch()
            own = any(item.kind != "relay" for item in batch)
            if cfg.cover_policy == "data":
                pad = any(item.kind in ("real", "retransmission") for item in batch)
            else:
                pad = own or cfg.cover_policy == "all"
            pad = pad and cfg.cover_traffic
            # Cover in a relay-only batch takes one hop so that cover never begets cover.
            make_cover = partial(self._make_cover, one_hop=not own)
            batch = mix_batch(batch, cfg.outbox_size, pad, make_cover, self.rng)
            for item, hold in zip(batch, release_delays(batch, cfg.mu, cfg.sigma, self.rng)):
                self.env.call_later(hold, partial(self._release, item))
            if not self.outbox.full:
                break
        if len(self.outbox) and self._fill_timer is None:
            self._fill_timer = self.env.call_later(cfg.effective_fill_timeout, self._on_fill_timeout)

    def _make_cover(self, one_hop: bool) -> OutboxItem | None:
        live = self.view.routable()
        if not live:
            return None
        dst = self.rng.choice(live)
        if one_hop:
            route = [dst]
        else:
            route = sample_route(live, self.node_id, dst, self.config.max_path_length, self.rng,
                                 self.config.path_length_weights)
        packet = create_packet(
            self.fmt, [self.view.hop(n) for n in route], sample_delays(len(route) - 1, self.config.mu, self.rng),
            encode_cover(), self.crypto_rng,
        )
        return OutboxItem(route[0], packet, "cover")

    def _release(self, item: OutboxItem) -> None:
        if not self.alive:
            return
        frame = wire.packet_frame(item.packet)
        self.stats.record_tx(item.kind, len(frame))
        self.env.transmit(self.node_id, item.next_hop, frame, TxMeta(item.kind, item.ref, item.message_id))
