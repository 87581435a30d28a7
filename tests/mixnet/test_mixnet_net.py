"""Real-network mode: one OS process per node, mutual TLS on loopback, same node logic."""

from __future__ import annotations

import ssl

import pytest

from mixnet.config import MixnetConfig
from mixnet.net_cluster import LocalCluster
from mixnet.net_tls import (
    client_context,
    generate_ca,
    issue_node_certificate,
    peer_node_id,
    write_cert,
    write_key,
)
from mixnet.transport import create_transport

CFG = MixnetConfig(max_path_length=2, outbox_size=4, payload_size=2048, mu=0.02, ack_timeout=0.6,
                   transport="network")

pytestmark = pytest.mark.timeout(60)


def test_three_processes_deliver_exactly_once_and_are_torn_down():
    cluster = create_transport(CFG, 3, seed=1)
    try:
        procs = [p.popen for p in cluster.processes.values()]
        assert len({p.pid for p in procs}) == 3 and all(p.poll() is None for p in procs)
        payload = bytes(range(256)) * 10  # two fragments at this body size
        ids = {(s, d): cluster.send(s, d, payload + bytes([s, d])) for s in range(3) for d in range(3) if s != d}
        cluster.run_until_idle(timeout=30)
        for (s, d), mid in ids.items():
            got = [m for m in cluster.inbox(d) if m.message_id == mid]
            assert len(got) == 1 and got[0].data == payload + bytes([s, d])
        stats = cluster.node_stats()
        assert all(st.packets_sent["real"] >= 4 and st.cpu_time_s > 0 for st in stats.values())
        assert all(cluster.status(i)["acked"] for i in range(3))
    finally:
        cluster.close()
    assert all(p.poll() is not None for p in procs)


def test_crashed_node_is_detected_and_avoided():
    with LocalCluster(CFG, 4, seed=2) as cluster:
        cluster.kill(3)
        ids = [cluster.send(0, 1, b"after crash %d" % k) for k in range(8)]
        ids2 = [cluster.send(2, 0, b"and back %d" % k) for k in range(8)]
        cluster.run_until_idle(timeout=30)
        assert sorted(m.message_id for m in cluster.inbox(1)) == sorted(ids)
        assert sorted(m.message_id for m in cluster.inbox(0)) == sorted(ids2)
        status = {i: cluster.status(i) for i in range(3)}
        detectors = [i for i in range(3) if status[i]["stats"]["link_failures"] > 0]
        assert detectors  # with ~40 packets and cover on 3 live peers, someone tried the dead one
        assert all(3 not in status[i]["routable"] for i in detectors)


def test_processes_are_killed_even_when_the_test_body_fails():
    with pytest.raises(RuntimeError, match="boom"):
        with LocalCluster(CFG, 3, seed=3) as cluster:
            procs = [p.popen for p in cluster.processes.values()]
            raise RuntimeError("boom")
    assert all(p.poll() is not None for p in procs)


def test_tls_rejects_a_certificate_from_another_ca(tmp_path):
    ca_key, ca_cert = generate_ca()
    key, cert = issue_node_certificate(ca_key, ca_cert, 7)
    write_cert(tmp_path / "ca.pem", ca_cert)
    write_key(tmp_path / "n.key", key)
    write_cert(tmp_path / "n.pem", cert)
    ctx = client_context(tmp_path / "n.pem", tmp_path / "n.key", tmp_path / "ca.pem")
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert peer_node_id({"subject": ((("commonName", "mixnet-node-7"),),)}) == 7
    with pytest.raises(ValueError, match="peercert"):
        peer_node_id({"subject": ((("commonName", "intruder"),),)})
