"""Discrete-event simulation of a whole mixnet in one process, in virtual time.

Every node is a real :class:`~mixnet.node.MixNode` doing real Sphinx
work on real packet bytes; the simulator only supplies the clock, timers and
links. Links add a latency (plus optional truncated-Gaussian jitter) and lose
frames with a given probability; sending to a node that is down fails after
one round trip, as a refused connection would. With a seed, everything
(keys, routes, delays, shuffles, losses, and hence the trace and the delivered
bytes) is reproducible; per-node CPU time is measured, so it is not.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from .config import MixnetConfig
from .crypto import SeededRandomSource, private_key_from_bytes
from .delivery import DeliveredMessage
from .identity import identity_from_source
from .node import MixNode, TxMeta
from .stats import NodeStats
from .topology import Topology, make_topology
from .trace import AdversaryView, GroundTruth, GroundTruthRecord, MessageRecord, TraceRecord

_T = TypeVar("_T")

DeliveryCallback = Callable[[int, DeliveredMessage], None]
#: Fault injector: ``(src, dst, kind) -> True`` loses that frame (``kind`` from stats.TX_KINDS).
FrameFilter = Callable[[int, int, str], bool]


class _Timer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class _SimEnv:
    """The :class:`~mixnet.node.NodeEnvironment` of one simulated node."""

    sim: Simulator
    node_id: int

    def now(self) -> float:
        return self.sim.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        return self.sim._schedule(self.sim.now + max(0.0, delay), self.node_id, callback)

    def transmit(self, src: int, dst: int, frame: bytes, meta: TxMeta) -> None:
        self.sim._transmit(src, dst, frame, meta)

    def on_delivered(self, node_id: int, message: DeliveredMessage) -> None:
        self.sim._on_delivered(node_id, message)

    def on_acked(self, node_id: int, message_id: bytes) -> None:
        record = self.sim._messages.get(message_id)
        if record is not None and record.acked is None:
            record.acked = self.sim.now

    def on_failed(self, node_id: int, message_id: bytes) -> None:
        record = self.sim._messages.get(message_id)
        if record is not None:
            record.failed = True


class Simulator:
    """A mixnet of ``n_nodes`` peers on one overlay topology.

    Parameters
    ----------
    config
        Transport parameters shared by all nodes.
    n_nodes
        Initial number of peers (ids ``0..n_nodes-1``).
    seed
        Fixes keys, routes, delays, shuffles and link losses.
    topology, degree
        Overlay used for learning neighbours and for bootstrapping joiners.
    latency, latency_jitter
        One-way link delay and the SD of its truncated-Gaussian jitter (seconds).
    loss
        Probability that a frame is lost on its link.
    record_trace
        Keep the adversary trace (turn off for very long runs to save memory).
    drop
        Optional fault injector, called for every frame with its true kind;
        returning True loses the frame (tests use it to drop one ack).
    """

    def __init__(
        self,
        config: MixnetConfig,
        n_nodes: int,
        *,
        seed: int = 0,
        topology: str = "circulant",
        degree: int = 4,
        latency: float = 0.005,
        latency_jitter: float = 0.0,
        loss: float = 0.0,
        record_trace: bool = True,
        drop: FrameFilter | None = None,
    ) -> None:
        if not isinstance(n_nodes, int) or n_nodes < 2:
            raise ValueError(f"n_nodes must be an int >= 2, got {n_nodes!r}")
        if not latency >= 0:
            raise ValueError(f"latency must be >= 0, got {latency}")
        if not latency_jitter >= 0:
            raise ValueError(f"latency_jitter must be >= 0, got {latency_jitter}")
        if not 0 <= loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {loss}")
        self.config = config
        self.seed = seed
        self.latency = latency
        self.latency_jitter = latency_jitter
        self.loss = loss
        self.record_trace = record_trace
        self.drop = drop
        self.now = 0.0
        self.topology: Topology = make_topology(topology, n_nodes, degree, random.Random(f"{seed}/topology"))
        self.nodes: dict[int, MixNode] = {}
        self._heap: list[tuple[float, int, int, Callable[[], None], _Timer]] = []
        self._seq = itertools.count()
        self._link_rng = random.Random(f"{seed}/links")
        self._churn_rng = random.Random(f"{seed}/churn")
        self._trace: list[TraceRecord] = []
        self._truth: list[GroundTruthRecord] = []
        self._messages: dict[bytes, MessageRecord] = {}
        self._callbacks: list[DeliveryCallback] = []
        self._incarnation: dict[int, int] = {}
        self._retired: dict[tuple[int, int], NodeStats] = {}  # stats of earlier incarnations, kept on rejoin
        for i in range(n_nodes):
            self._create_node(i)
        infos = [node.info for node in self.nodes.values()]
        for node in self.nodes.values():  # bootstrap directory, handed out before the run
            for info in infos:
                node.add_peer(info)

    # ------------------------------------------------------------- set-up --
    def _create_node(self, node_id: int) -> MixNode:
        incarnation = self._incarnation.get(node_id, -1) + 1
        if node_id in self.nodes:  # a rejoin: the departed incarnation's counters stay readable
            self._retired[(node_id, incarnation - 1)] = self.nodes[node_id].stats
        self._incarnation[node_id] = incarnation
        label = f"node/{node_id}/{incarnation}".encode()
        crypto_rng = SeededRandomSource(self.seed, label)
        key = private_key_from_bytes(crypto_rng.random_bytes(32))
        # One identity per node id, kept across incarnations (a rejoin re-keys Sphinx, not the identity);
        # drawn from its own stream so that the Sphinx keys, routes and packets are those of earlier versions.
        identity = identity_from_source(SeededRandomSource(self.seed, f"identity/{node_id}".encode()))
        node = MixNode(
            node_id, key, self.config, _SimEnv(self, node_id),
            rng=random.Random(f"{self.seed}/node/{node_id}/{incarnation}"), crypto_rng=crypto_rng,
            identity_key=identity, epoch=incarnation,
        )
        self.nodes[node_id] = node
        return node

    # --------------------------------------------------------------- API --
    def send(self, src: int, dst: int, data: bytes) -> bytes:
        """Queue ``data`` from ``src`` to ``dst`` now; returns the message id."""
        node = self._live(src, "src")
        if dst not in self.nodes:
            raise ValueError(f"dst must be a known node id, got {dst}")
        message_id = self._timed(src, lambda: node.send(dst, data))
        self._messages[message_id] = MessageRecord(message_id, src, dst, len(data), self.now)
        return message_id

    def on_deliver(self, callback: DeliveryCallback) -> None:
        """Call ``callback(node_id, message)`` whenever a message completes at a receiver."""
        self._callbacks.append(callback)

    def inbox(self, node_id: int) -> list[DeliveredMessage]:
        """Messages delivered to ``node_id``, each exactly once, in arrival order."""
        return list(self.nodes[node_id].inbox)

    def run_until(self, t: float) -> None:
        """Process every event up to virtual time ``t``."""
        while self._heap and self._heap[0][0] <= t:
            self._step()
        self.now = max(self.now, t)

    def run_until_idle(self, max_time: float | None = None) -> float:
        """Process events until none is left (or ``max_time``); returns the virtual time."""
        while self._heap:
            if max_time is not None and self._heap[0][0] > max_time:
                self.now = max(self.now, max_time)
                break
            self._step()
        return self.now

    def join(self, node_id: int | None = None, bootstrap: Iterable[int] | None = None) -> int:
        """Start a node (a new id, or a departed one coming back with a fresh key).

        It learns only its bootstrap peers (default: up to ``degree`` random live
        nodes) and announces itself with JOIN control messages; the rest of the
        network learns about it by flooding.
        """
        if node_id is None:
            node_id = max(self.nodes) + 1
        if node_id in self.nodes and self.nodes[node_id].alive:
            raise ValueError(f"node_id {node_id} is already running")
        live = sorted(i for i, n in self.nodes.items() if n.alive)
        if bootstrap is None:
            degree = max(1, min(len(live), max(len(a) for a in self.topology.adjacency)))
            bootstrap = self._churn_rng.sample(live, degree)
        peers = [self.nodes[i].info for i in bootstrap]
        node = self._create_node(node_id)
        self._timed(node_id, lambda: node.join(peers))
        return node_id

    def leave(self, node_id: int, graceful: bool = False) -> None:
        """Stop a node: a crash by default (peers must detect it), or a graceful LEAVE."""
        node = self._live(node_id, "node_id")
        if graceful:
            self._timed(node_id, node.leave)
        node.alive = False

    def close(self) -> None:
        """Nothing to release (a simulation owns no processes); here for the Transport protocol."""

    def adversary_view(self, with_topology: bool = True) -> AdversaryView:
        """The passive global adversary's observation; ``with_topology`` adds the public learning graph."""
        cfg = self.config
        return AdversaryView(
            tuple(self._trace), cfg.packet_format.packet_size + 1, cfg.mu, cfg.effective_fill_timeout,
            cfg.outbox_size, cfg.max_path_length,
            self.topology.adjacency if with_topology else None,
        )

    def ground_truth(self) -> GroundTruth:
        return GroundTruth(tuple(self._truth))

    def node_stats(self) -> dict[int, NodeStats]:
        """Counters of each node's current incarnation (see :meth:`incarnation_stats` for rejoined nodes)."""
        return {i: node.stats for i, node in sorted(self.nodes.items())}

    def incarnation(self, node_id: int) -> int:
        """How many times ``node_id`` has (re)joined before its current incarnation (0 = never left)."""
        if node_id not in self._incarnation:
            raise ValueError(f"node_id must be a known node id, got {node_id}")
        return self._incarnation[node_id]

    def incarnation_stats(self) -> dict[tuple[int, int], NodeStats]:
        """Counters per ``(node_id, incarnation)``: a node that crashed and rejoined with a fresh key
        keeps one entry per life, so nothing it did before rejoining is lost."""
        out = dict(self._retired)
        out.update({(i, self._incarnation[i]): node.stats for i, node in self.nodes.items()})
        return dict(sorted(out.items()))

    def message_records(self) -> dict[bytes, MessageRecord]:
        return dict(self._messages)

    def batch_delivery_time(self, message_ids: Iterable[bytes]) -> float:
        """Virtual time from the first send to the last delivery of a batch (inf if any is missing)."""
        records = [self._messages[m] for m in message_ids]
        if not records:
            raise ValueError("message_ids must not be empty")
        delivered = [r.delivered for r in records if r.delivered is not None]
        if len(delivered) < len(records):
            return float("inf")
        return max(delivered) - min(r.sent for r in records)

    # ---------------------------------------------------------- internals --
    def _live(self, node_id: int, name: str) -> MixNode:
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            raise ValueError(f"{name} must be a running node id, got {node_id}")
        return node

    def _timed(self, node_id: int, fn: Callable[[], _T]) -> _T:
        start = time.process_time()
        try:
            return fn()
        finally:
            self.nodes[node_id].stats.cpu_time_s += time.process_time() - start

    def _schedule(self, at: float, node_id: int, callback: Callable[[], None]) -> _Timer:
        timer = _Timer()
        heapq.heappush(self._heap, (at, next(self._seq), node_id, callback, timer))
        return timer

    def _step(self) -> None:
        at, _, node_id, callback, timer = heapq.heappop(self._heap)
        if timer.cancelled:
            return
        self.now = at
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return
        start = time.process_time()
        callback()
        node.stats.cpu_time_s += time.process_time() - start

    def _transmit(self, src: int, dst: int, frame: bytes, meta: TxMeta) -> None:
        target = self.nodes.get(dst)
        sender = self.nodes[src]
        if target is None or not target.alive:  # connection refused after one round trip
            self._schedule(self.now + 2 * self.latency, src, lambda: sender.on_link_failure(dst))
            return
        delay = self.latency
        if self.latency_jitter > 0:
            delay = max(0.0, delay + self._link_rng.gauss(0.0, self.latency_jitter))
        lost = self.loss > 0 and self._link_rng.random() < self.loss
        lost = lost or (self.drop is not None and self.drop(src, dst, meta.kind))
        index = len(self._trace)
        if self.record_trace:
            self._trace.append(TraceRecord(self.now, src, dst, len(frame), None if lost else self.now + delay))
            in_ref = meta.in_ref if isinstance(meta.in_ref, int) else None
            message_id = meta.message_id
            if in_ref is not None and message_id is None:  # a relay cannot know it; the truth follows the chain
                message_id = self._truth[in_ref].message_id
            self._truth.append(GroundTruthRecord(meta.kind, in_ref, message_id))
        if lost:
            return
        incarnation = self._incarnation[dst]

        def arrive() -> None:
            if self._incarnation[dst] == incarnation:  # a frame never reaches a later incarnation
                target.on_frame(src, frame, index if self.record_trace else None)

        self._schedule(self.now + delay, dst, arrive)

    def _on_delivered(self, node_id: int, message: DeliveredMessage) -> None:
        record = self._messages.get(message.message_id)
        if record is not None:
            record.deliveries += 1
            if record.delivered is None:
                record.delivered = self.now
        for callback in self._callbacks:
            callback(node_id, message)
