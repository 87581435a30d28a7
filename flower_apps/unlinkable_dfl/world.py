"""The world the ServerApp plays: the network between the nodes, in virtual time, and churn.

Three transports carry one round's fragments from sender to receiver:

* ``mixnet``: the landed ``mixnet`` simulator with the study's K, O, mu, sigma and
  cover traffic: real Sphinx packets over relays, SURB acks, retransmission.
* ``direct``: the same simulator with K = 1, O = 1, no cover and a 1 ms hold time, i.e.
  Sphinx-encrypted packets sent straight to the receiver (the "mixnet off" condition:
  same packet format and acks, no relays, no batching, no cover).
* ``baseline``: no packets at all; each payload reaches its receiver at once (the
  non-anonymous DFL FedAvg baseline exchanging full models with its neighbours).

With ``network=True`` the ``mixnet`` / ``direct`` transports run as N real OS processes
over TLS on loopback (``mixnet.net_cluster.LocalCluster``): the same MixNode code,
real seconds instead of virtual ones, no churn.

The world also remembers who sent what (``MessageRecord``), for scoring only: receivers
get anonymous payloads.
"""

from __future__ import annotations

import random
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from mixnet import MixnetConfig, Simulator, create_transport
from mixnet.stats import NodeStats
from mixnet.topology import Topology, make_topology

DIRECT_MU = 1e-3  # hold time of the "mixnet off" transport (the config requires mu > 0)
JOIN_SETTLE_S = 0.5  # virtual time for JOIN/VIEW floods before a round's sends
MEANINGFUL = ("real", "retransmission", "ack")


def mixnet_config(cfg) -> MixnetConfig:  # cfg: UdflConfig
    """Transport parameters of a run (the ``direct`` transport is the degenerate mixnet)."""
    if cfg.transport == "mixnet":
        return MixnetConfig(max_path_length=cfg.max_hops, outbox_size=cfg.outbox, mu=cfg.mu, sigma=cfg.sigma,
                            cover_traffic=cfg.cover, cover_policy=cfg.cover_policy, payload_size=cfg.payload_size)
    return MixnetConfig(max_path_length=1, outbox_size=1, mu=DIRECT_MU, sigma=0.0, cover_traffic=False,
                        payload_size=cfg.payload_size)


@dataclass
class RoundDelivery:
    """What one round's transport phase did."""

    inbox: dict[int, list[bytes]]  # receiver -> payloads delivered this round (no sender)
    sent_by: dict[int, list[int]]  # receiver -> true sender of each inbox payload (scoring only)
    intended: int  # payloads the nodes asked to send
    delivered: int  # of this round's payloads, delivered in time
    network_s: float  # virtual time from the first send to the last in-time delivery
    bytes_sent: dict[int, int] = field(default_factory=dict)  # per node, all kinds
    packets_sent: dict[int, dict[str, int]] = field(default_factory=dict)
    cpu_s: dict[int, float] = field(default_factory=dict)  # per node, Sphinx/mixing work
    rtt_s: list[float] = field(default_factory=list)  # send -> ack of this round's payloads
    departed: list[int] = field(default_factory=list)  # nodes that crashed during the round


class World:
    """Nodes' liveness, the learning topology and the transport of a run."""

    def __init__(self, cfg, network: bool = False) -> None:  # cfg: UdflConfig
        self.cfg = cfg
        self.kind = cfg.transport
        self.rng = random.Random(f"{cfg.seed}/world")
        self.sim: Simulator | None = None
        self.net = None  # a LocalCluster when network=True
        if network and self.kind != "baseline":
            if cfg.churn_leave > 0:
                raise ValueError("the networked transport runs without churn: set udfl-churn-leave 0")
            # the simulator's topology derivation, so both transports give the same learning graph
            self.topology: Topology = make_topology(cfg.topology, cfg.num_nodes, cfg.degree,
                                                    random.Random(f"{cfg.seed}/topology"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.net = create_transport(replace(mixnet_config(cfg), transport="network"), cfg.num_nodes,
                                            seed=cfg.seed)
        elif self.kind == "baseline":
            self.topology = make_topology(cfg.topology, cfg.num_nodes, cfg.degree,
                                          random.Random(f"{cfg.seed}/topology"))
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "cover off" warning: intended for the direct transport
                self.sim = Simulator(mixnet_config(cfg), cfg.num_nodes, seed=cfg.seed, topology=cfg.topology,
                                     degree=cfg.degree, latency=cfg.latency)
            self.topology = self.sim.topology
        self.alive = set(range(cfg.num_nodes))
        self.absent: set[int] = set()  # deployment: nodes whose data no SuperNode holds (never rejoin)
        self._inbox_pos: dict[int, int] = dict.fromkeys(range(cfg.num_nodes), 0)
        self._node_obj: dict[int, object] = dict(self.sim.nodes) if self.sim else {}
        self._msg: dict[bytes, tuple[int, int, int]] = {}  # message id -> (src, dst, round)

    # ------------------------------------------------------------ liveness --
    def learning_neighbours(self, node: int) -> list[int]:
        """Topology neighbours currently believed alive (the node's learning peers this round)."""
        return [j for j in self.topology.neighbours(node) if j in self.alive]

    def exclude(self, nodes) -> None:
        """Nodes absent for the whole run (a deployment whose SuperNode holds no usable data for them).

        They leave before the first round, as crashed nodes (peers route around them), and never rejoin.
        """
        for i in sorted(set(nodes) & self.alive):
            self.alive.discard(i)
            self.absent.add(i)
            if self.sim is not None:
                self.sim.leave(i)

    def rejoin(self) -> list[int]:
        """Start of a round: each departed node comes back with probability ``churn-join``."""
        back = sorted(i for i in set(range(self.cfg.num_nodes)) - self.alive - self.absent
                      if self.rng.random() < self.cfg.churn_join)
        for i in back:
            self.alive.add(i)
            if self.sim is not None:
                self.sim.join(i)
                self._node_obj[i] = self.sim.nodes[i]
                self._inbox_pos[i] = 0
        if back and self.sim is not None:
            self.sim.run_until(self.sim.now + JOIN_SETTLE_S)
        return back

    def plan_departures(self) -> dict[int, float]:
        """Nodes that crash during this round's transport phase, and when (seconds after its start)."""
        if self.cfg.churn_leave <= 0:
            return {}
        out: dict[int, float] = {}
        for i in sorted(self.alive):
            if len(self.alive) - len(out) > 3 and self.rng.random() < self.cfg.churn_leave:
                # mid-transmission: the mixnet delivers a round in ~(K + 1)(F + mu) seconds
                out[i] = self.rng.uniform(0.0, (self.cfg.max_hops + 1) * 2 * self.cfg.mu)
        return out

    # ----------------------------------------------------------- transport --
    def close(self) -> None:
        """Stop the node processes of the networked transport (nothing to do for the others)."""
        if self.net is not None:
            self.net.close()
            self.net = None

    def deliver(self, round_: int, sends: list[tuple[int, int, bytes]], departures: dict[int, float]) -> RoundDelivery:
        """Carry ``(src, dst, payload)`` triples; crash ``departures`` on the way."""
        if self.net is not None:
            return self._deliver_network(round_, sends)
        if self.sim is None:
            return self._deliver_baseline(sends, departures)
        sim = self.sim
        before = {i: _snapshot(s) for i, s in sim.node_stats().items()}
        t0 = sim.now
        ids = []
        for src, dst, payload in sends:
            mid = sim.send(src, dst, payload)
            self._msg[mid] = (src, dst, round_)
            ids.append(mid)
        for gone, offset in sorted(departures.items(), key=lambda kv: kv[1]):
            sim.run_until(t0 + offset)
            sim.leave(gone)
            self.alive.discard(gone)
        sim.run_until_idle(max_time=t0 + self.cfg.virtual_round_timeout)
        records = sim.message_records()
        this = [records[m] for m in ids]
        done = [r for r in this if r.delivered is not None and r.delivered <= t0 + self.cfg.virtual_round_timeout]
        inbox: dict[int, list[bytes]] = {}
        sent_by: dict[int, list[int]] = {}
        for i in sorted(self.alive):
            node = sim.nodes[i]
            if node is not self._node_obj.get(i):  # a fresh incarnation: new inbox
                self._node_obj[i], self._inbox_pos[i] = node, 0
            new = node.inbox[self._inbox_pos[i]:]
            self._inbox_pos[i] = len(node.inbox)
            inbox[i] = [m.data for m in new]
            sent_by[i] = [self._msg.get(m.message_id, (-1, -1, -1))[0] for m in new]
        after = sim.node_stats()
        delivery = RoundDelivery(inbox, sent_by, len(sends), len(done),
                                 max((cast(float, r.delivered) for r in done), default=t0) - t0,  # done: not None
                                 departed=sorted(departures))
        for i, s in after.items():
            b = before.get(i) if self._same_incarnation(i, before) else None
            delivery.bytes_sent[i] = s.total_bytes_sent - (b["bytes"] if b else 0)
            delivery.packets_sent[i] = {k: v - (b["packets"][k] if b else 0) for k, v in s.packets_sent.items()}
            delivery.cpu_s[i] = s.cpu_time_s - (b["cpu"] if b else 0.0)
        delivery.rtt_s = [r.acked - r.sent for r in this if r.acked is not None]
        return delivery

    def _deliver_network(self, round_: int, sends: list[tuple[int, int, bytes]]) -> RoundDelivery:
        """One round over the node processes; ``network_s`` is real seconds until every fragment is acked."""
        net = self.net
        assert net is not None  # deliver() calls this only with a networked transport
        before = net.node_stats()
        t0 = time.monotonic()
        ids = []
        for src, dst, payload in sends:
            mid = net.send(src, dst, payload)
            self._msg[mid] = (src, dst, round_)
            ids.append(mid)
        try:
            net.run_until_idle(timeout=self.cfg.virtual_round_timeout)
        except TimeoutError:
            pass  # what did not arrive in time shows in completeness
        wall = time.monotonic() - t0
        inbox: dict[int, list[bytes]] = {}
        sent_by: dict[int, list[int]] = {}
        arrived: set[bytes] = set()
        for i in sorted(self.alive):
            got = net.inbox(i)
            new = got[self._inbox_pos[i]:]
            self._inbox_pos[i] = len(got)
            inbox[i] = [m.data for m in new]
            sent_by[i] = [self._msg.get(m.message_id, (-1, -1, -1))[0] for m in new]
            arrived |= {m.message_id for m in new}
        delivery = RoundDelivery(inbox, sent_by, len(sends), sum(m in arrived for m in ids), wall)
        for i, s in net.node_stats().items():
            b = before.get(i)
            delivery.bytes_sent[i] = s.total_bytes_sent - (b.total_bytes_sent if b else 0)
            delivery.packets_sent[i] = {k: v - (b.packets_sent[k] if b else 0) for k, v in s.packets_sent.items()}
            delivery.cpu_s[i] = s.cpu_time_s - (b.cpu_time_s if b else 0.0)
        return delivery

    def _same_incarnation(self, node: int, before: dict) -> bool:
        assert self.sim is not None  # called by deliver() on the simulated transport only
        return node in before and before[node]["obj"] is self.sim.nodes[node].stats

    def _deliver_baseline(self, sends: list[tuple[int, int, bytes]], departures: dict[int, float]) -> RoundDelivery:
        inbox: dict[int, list[bytes]] = {i: [] for i in self.alive}
        sent_by: dict[int, list[int]] = {i: [] for i in self.alive}
        out_bytes: dict[int, int] = dict.fromkeys(self.alive, 0)
        packets: dict[int, dict[str, int]] = {i: {"real": 0} for i in self.alive}
        delivered = 0
        for node in departures:
            self.alive.discard(node)
        for src, dst, payload in sends:
            out_bytes[src] = out_bytes.get(src, 0) + len(payload)
            packets.setdefault(src, {"real": 0})["real"] += 1
            if dst in self.alive:
                inbox.setdefault(dst, []).append(payload)
                sent_by.setdefault(dst, []).append(src)
                delivered += 1
        return RoundDelivery({i: inbox.get(i, []) for i in self.alive}, sent_by, len(sends), delivered, 0.0,
                             out_bytes, packets, dict.fromkeys(out_bytes, 0.0), [], sorted(departures))


def _snapshot(stats: NodeStats) -> dict:
    return {"bytes": stats.total_bytes_sent, "packets": dict(stats.packets_sent), "cpu": stats.cpu_time_s,
            "obj": stats}


def honest_mean(values: dict[int, float], byzantine: set[int]) -> float:
    vals = [v for k, v in values.items() if k not in byzantine]
    return float(np.mean(vals)) if vals else float("nan")
