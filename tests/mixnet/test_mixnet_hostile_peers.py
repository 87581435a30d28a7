"""An authenticated but malicious peer: hijacks, floods and replays are refused, counted and bounded.

Before the fix (issue 36 review): one JOIN or VIEW from any peer re-keyed another
node (0 of 10 packets reached it afterwards), 20 VIEW frames grew a view to
210,003 entries, fragments announcing 65,535 parts were kept forever, and a
packet replayed after ``replay_capacity`` others was processed again.
"""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import replace

import pytest

from mixnet import wire
from mixnet.config import MixnetConfig
from mixnet.crypto import SeededRandomSource
from mixnet.messages import DataFragment, encode_cover, encode_data
from mixnet.net_cluster import LocalCluster
from mixnet.net_tls import client_context, node_name
from mixnet.peers import PeerInfo
from mixnet.simulator import Simulator
from mixnet.surb import create_surb
from mixnet.testing import attacker_record, frame_to, make_hops

CFG = MixnetConfig(max_path_length=2, outbox_size=4, payload_size=1024, mu=0.05, ack_timeout=2.0)
ATTACKER = 2  # an honest-looking, authenticated member of the network


def _delivered(sim: Simulator, src: int, dst: int, n: int = 10) -> int:
    """Send ``n`` messages and count how many reached ``dst`` (each exactly once)."""
    ids = [sim.send(src, dst, b"after the attack %d" % k) for k in range(n)]
    sim.run_until_idle()
    records = sim.message_records()
    assert all(records[m].deliveries <= 1 for m in ids)
    return sum(records[m].deliveries for m in ids)


# ------------------------------------------------------------------ hijacks --
def test_join_rekeying_another_node_is_refused_counted_not_flooded_and_packets_still_arrive():
    sim = Simulator(CFG, 6, seed=0)
    node, victim = sim.nodes[0], sim.nodes[1]
    control_before = node.stats.packets_sent["control"]
    node.on_frame(ATTACKER, wire.join_frame(attacker_record(1, seed=9, endpoint="10.6.6.6:1")))
    assert node.stats.dropped_hijack == 1
    assert node.view.get(1) == victim.info and node.view.get(1).endpoint == ""
    assert node.stats.packets_sent["control"] == control_before  # neither answered nor flooded
    assert _delivered(sim, 0, 1) == 10  # before the fix: 0 of 10


def test_join_with_the_victims_identity_but_a_forged_signature_is_refused():
    sim = Simulator(CFG, 6, seed=0)
    node, victim = sim.nodes[0], sim.nodes[1]
    forged = attacker_record(1, seed=9)
    forged = PeerInfo(1, forged.public_key, "", victim.info.identity, victim.info.version + 1, forged.signature)
    node.on_frame(ATTACKER, wire.join_frame(forged))
    assert node.stats.dropped_bad_signature == 1 and node.stats.dropped_hijack == 0
    assert node.view.get(1) == victim.info
    assert _delivered(sim, 0, 1) == 10


def test_view_reply_cannot_rekey_known_nodes_and_unsolicited_views_are_ignored():
    sim = Simulator(CFG, 6, seed=0)
    node = sim.nodes[0]
    node.on_frame(ATTACKER, wire.view_frame([attacker_record(1, seed=9), attacker_record(3, seed=10)]))
    assert node.stats.dropped_unsolicited_view == 1 and node.stats.dropped_hijack == 0  # not even read
    node.join([sim.nodes[ATTACKER].info])  # now a VIEW from the attacker is expected, and read
    node.on_frame(ATTACKER, wire.view_frame([attacker_record(1, seed=9), attacker_record(3, seed=10)]))
    assert node.stats.dropped_hijack == 2
    assert node.view.get(1) == sim.nodes[1].info and node.view.get(3) == sim.nodes[3].info
    assert _delivered(sim, 0, 1) == 10 and _delivered(sim, 0, 3) == 10


def test_a_node_still_reannounces_itself_and_a_rejoin_supersedes_its_old_record():
    sim = Simulator(CFG, 6, seed=0)
    old = sim.nodes[4].info
    sim.leave(4)
    sim.run_until(1.0)
    sim.join(4, bootstrap=[0])  # fresh Sphinx key, same identity, next epoch: flooded on from node 0
    sim.run_until_idle()
    new = sim.nodes[4].info
    assert new.public_key != old.public_key and new.identity == old.identity and new.version > old.version
    assert all(sim.nodes[i].view.get(4) == new for i in (0, 1, 2, 3, 5))
    assert sum(s.dropped_hijack + s.dropped_stale_record for s in sim.node_stats().values()) == 0
    sim.nodes[0].on_frame(ATTACKER, wire.join_frame(old))  # a replayed old record: a rollback
    assert sim.nodes[0].stats.dropped_stale_record == 1 and sim.nodes[0].view.get(4) == new
    assert _delivered(sim, 0, 4) == 10


# ------------------------------------------------------------------- floods --
def _fake_peers(n: int, first_id: int) -> list[PeerInfo]:
    return [attacker_record(first_id + i, seed=1000 + i) for i in range(n)]


def test_view_flood_keeps_the_view_bounded_and_counted():
    cfg = replace(CFG, max_path_length=1, max_peers=32)  # one hop: fakes are never relays here
    sim = Simulator(cfg, 6, seed=0)
    node = sim.nodes[0]
    fakes = _fake_peers(300, first_id=10_000)
    for k in range(20):  # unsolicited: dropped before any record is parsed into the view
        node.on_frame(ATTACKER, wire.view_frame(fakes[k * 15 : (k + 1) * 15]))
    assert node.stats.dropped_unsolicited_view == 20 and len(node.view) == 6
    node.join([sim.nodes[ATTACKER].info])
    node.on_frame(ATTACKER, wire.view_frame(fakes))  # the one expected reply, stuffed with 300 identities
    assert len(node.view) == 32  # before the fix: 306
    assert node.stats.dropped_view_full == 300 - 26
    assert all(node.view.get(i) == sim.nodes[i].info for i in range(1, 6))
    dead = node.view.routable()[-3:]  # three fakes found dead make room for three newcomers, no more
    for i in dead:
        node.on_link_failure(i)
    node.join([sim.nodes[3].info])
    node.on_frame(3, wire.view_frame(_fake_peers(5, first_id=20_000)))
    assert len(node.view) == 32 and node.stats.peers_evicted == 3
    assert all(node.view.get(i) is None for i in dead)
    assert _delivered(sim, 0, 1) == 10


def _data_frame(sim: Simulator, dst: int, message_id: bytes, index: int, count: int, rng: SeededRandomSource) -> bytes:
    fmt = sim.config.packet_format
    back = make_hops({ATTACKER: sim.nodes[ATTACKER].keyring.current})[ATTACKER]
    surb, _ = create_surb(fmt, [back], [], rng)
    return frame_to(fmt, sim.nodes[dst].info, encode_data(fmt, DataFragment(message_id, index, count, surb, b"junk")),
                    rng)


def test_partial_message_flood_is_bounded_evicted_refused_and_expired():
    cfg = replace(CFG, partial_max_messages=8, partial_max_fragments=16, partial_ttl=5.0)
    sim = Simulator(cfg, 6, seed=0)
    node, rng = sim.nodes[1], SeededRandomSource(1, b"flood")
    for k in range(100):  # 100 messages announcing 2 fragments, each sending only the first
        node.on_frame(ATTACKER, _data_frame(sim, 1, b"%016d" % k, 0, 2, rng))
    assert node.partial_messages == 8 and node.stats.partials_evicted == 92  # before the fix: 100, never dropped
    for k in range(5):
        node.on_frame(ATTACKER, _data_frame(sim, 1, b"big%013d" % k, 0, 65_535, rng))
    assert node.stats.dropped_oversized_message == 5 and node.partial_messages == 8
    sim.run_until(sim.now + 5.5)  # past the TTL of every stored partial
    node.on_frame(ATTACKER, _data_frame(sim, 1, b"late%012d" % 0, 0, 2, rng))
    assert node.stats.partials_expired == 8 and node.partial_messages == 1
    assert node.stats.delivered_messages == 0 and not node.inbox
    mid = sim.send(0, 1, bytes(range(256)) * 10)  # several fragments: an honest multi-fragment message
    sim.run_until_idle()
    assert [m.message_id for m in sim.inbox(1)] == [mid]
    with pytest.raises(ValueError, match="partial_max_fragments = 16"):
        sim.send(0, 1, bytes(17 * 1024))


# -------------------------------------------------------- replay / rotation --
def _fill_cache(sim: Simulator, dst: int, n: int, rng: SeededRandomSource) -> None:
    """``n`` distinct cover packets for ``dst``, each one tag in its replay cache."""
    for _ in range(n):
        sim.nodes[dst].on_frame(ATTACKER, frame_to(sim.config.packet_format, sim.nodes[dst].info, encode_cover(), rng))


@pytest.mark.parametrize("rotation", [True, False], ids=["rotating", "not-rotating"])
def test_a_replay_older_than_the_cache_window_is_unprocessable_with_key_rotation(rotation):
    cap = 40
    sim = Simulator(replace(CFG, replay_capacity=cap, key_rotation=rotation, key_grace_period=1.0), 6, seed=0)
    node, rng = sim.nodes[1], SeededRandomSource(2, b"replay")
    captured = frame_to(sim.config.packet_format, node.info, encode_cover(), rng)
    node.on_frame(ATTACKER, captured)
    _fill_cache(sim, 1, 2 * cap + 1, rng)  # two generation swaps: the captured tag has left the cache
    sim.run_until(sim.now + 2.0)  # past the grace period
    cover_before, tampered_before = node.stats.cover_received, node.stats.dropped_tampered
    node.on_frame(ATTACKER, captured)
    if rotation:
        assert node.stats.key_rotations == 2
        assert node.stats.dropped_tampered == tampered_before + 1 and node.stats.cover_received == cover_before
    else:  # the documented limit without rotation: the window is capacity packets
        assert node.stats.key_rotations == 0 and node.stats.cover_received == cover_before + 1


def test_rotation_keeps_a_grace_period_and_peers_learn_the_new_key():
    cap = 40
    sim = Simulator(replace(CFG, replay_capacity=cap, key_grace_period=1.0), 6, seed=0)
    node, rng = sim.nodes[1], SeededRandomSource(3, b"grace")
    first = node.info
    in_flight = [frame_to(sim.config.packet_format, first, encode_cover(), rng) for _ in range(2)]
    _fill_cache(sim, 1, cap + 1, rng)
    assert node.stats.key_rotations == 1 and node.info.public_key != first.public_key
    assert node.info.identity == first.identity and node.info.version == first.version + 1
    node.on_frame(ATTACKER, in_flight[0])  # built with the old key, arrives within the grace period
    assert node.stats.previous_key_packets == 1
    sim.run_until(sim.now + 1.5)  # the signed re-announcement has reached every peer; grace is over
    assert all(sim.nodes[i].view.get(1) == node.info for i in (0, 2, 3, 4, 5))
    tampered = node.stats.dropped_tampered
    node.on_frame(ATTACKER, in_flight[1])
    assert node.stats.dropped_tampered == tampered + 1 and node.stats.previous_key_packets == 1
    assert sum(s.dropped_hijack + s.dropped_bad_signature for s in sim.node_stats().values()) == 0
    assert _delivered(sim, 0, 1) == 10 and _delivered(sim, 1, 5) == 10


def test_traffic_through_rotating_nodes_is_delivered_exactly_once():
    sim = Simulator(replace(CFG, replay_capacity=30), 6, seed=4)
    ids = [sim.send(s, d, b"%d->%d" % (s, d)) for _ in range(4) for s in range(6) for d in range(6) if s != d]
    sim.run_until_idle()
    records = sim.message_records()
    assert all(records[m].deliveries == 1 and records[m].acked is not None for m in ids)
    stats = sim.node_stats()
    assert all(s.key_rotations >= 1 for s in stats.values()) and sum(s.key_rotations for s in stats.values()) >= 10
    assert sum(s.previous_key_packets for s in stats.values()) > 0  # in-flight packets used the grace period
    for i, n in sim.nodes.items():
        assert all(sim.nodes[j].view.get(i) == n.info for j in sim.nodes if j != i)


# ---------------------------------------------------------------- networked --
NET_CFG = MixnetConfig(max_path_length=2, outbox_size=4, payload_size=2048, mu=0.02, ack_timeout=0.6,
                       transport="network")


async def _send_as_compromised_node(cluster: LocalCluster, as_node: int, to_node: int, frames: list[bytes]) -> None:
    """Connect with ``as_node``'s CA-issued certificate (a compromised member) and send raw frames."""
    wd = cluster.workdir
    ctx = client_context(wd / f"node{as_node}.pem", wd / f"node{as_node}.key", wd / "ca.pem")
    host, port = cluster.directory[to_node]["endpoint"].rsplit(":", 1)
    _, writer = await asyncio.wait_for(
        asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=node_name(to_node)), 5.0)
    try:
        for frame in frames:
            writer.write(struct.pack(">I", len(frame)) + frame)
        await writer.drain()
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.timeout(60)
def test_networked_hijack_over_an_authenticated_link_is_refused_and_packets_reach_the_real_node():
    with LocalCluster(NET_CFG, 3, seed=5) as cluster:
        real = cluster.directory[1]
        frames = [wire.join_frame(attacker_record(1, seed=9, endpoint="127.0.0.1:9")),
                  wire.view_frame([attacker_record(1, seed=9, endpoint="127.0.0.1:9")])]
        asyncio.run(_send_as_compromised_node(cluster, ATTACKER, 0, frames))
        deadline = time.monotonic() + 10
        while (stats := cluster.status(0)["stats"])["dropped_hijack"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stats["dropped_hijack"] == 1 and stats["dropped_unsolicited_view"] == 1
        assert next(p for p in cluster.status(0)["peers"] if p["node_id"] == 1) == real
        ids = [cluster.send(0, 1, b"after the attack %d" % k) for k in range(10)]
        cluster.run_until_idle(timeout=30)
        assert sorted(m.message_id for m in cluster.inbox(1)) == sorted(ids)  # before the fix: 0 of 10
