"""Issue 17 API gaps: message id in the ground truth, topology in the view, per-incarnation stats,
``fragment_capacity`` exported, mu = 0 refused with a clear error."""

from __future__ import annotations

import pytest

import mixnet
from mixnet.config import MixnetConfig
from mixnet.constants import PacketFormat
from mixnet.simulator import Simulator
from mixnet.trace import AdversaryView

CFG = MixnetConfig(max_path_length=2, outbox_size=4, payload_size=1024, mu=0.05, ack_timeout=2.0)


def test_ground_truth_names_the_message_of_every_data_relay_and_ack_frame():
    sim = Simulator(CFG, 6, seed=3)
    mids = {sim.send(0, 3, b"a" * 10): (0, 3), sim.send(2, 5, b"b" * 10): (2, 5)}
    sim.run_until_idle()
    view, truth = sim.adversary_view(), sim.ground_truth()
    assert len(view.records) == len(truth.records)
    seen = {m: {"real": 0, "ack": 0, "relay": 0} for m in mids}
    for rec, t in zip(view.records, truth.records):
        if t.kind in ("cover", "control"):
            assert t.message_id is None
            continue
        if t.kind == "relay" and t.message_id is None:  # a relayed cover packet: its chain starts as cover
            root = t
            while root.kind == "relay":
                root = truth.records[root.in_ref]
            assert root.kind == "cover"
            continue
        assert t.message_id in mids, t
        seen[t.message_id][t.kind if t.kind in ("real", "ack") else "relay"] += 1
        if t.kind == "real":
            assert rec.src == mids[t.message_id][0]  # the sender's own first frame
        if t.kind == "relay":  # inherited along the chain: the parent frame carries the same message
            assert truth.records[t.in_ref].message_id == t.message_id
    for m in mids:
        assert seen[m]["real"] == 1 and seen[m]["ack"] == 1
    # the chain of each message ends at its receiver
    for i, t in enumerate(truth.records):
        if t.kind == "real":
            j, child = i, {u.in_ref: k for k, u in enumerate(truth.records) if u.kind == "relay"}
            while j in child:
                j = child[j]
            assert view.records[j].dst == mids[t.message_id][1]


def test_adversary_view_carries_the_public_topology_on_request():
    sim = Simulator(CFG, 6, seed=0, topology="circulant", degree=2)
    view = sim.adversary_view()
    assert view.topology == tuple(tuple(a) for a in sim.topology.adjacency)
    assert view.neighbours()[0] == tuple(sim.topology.neighbours(0))
    assert sim.adversary_view(with_topology=False).topology is None
    assert AdversaryView((), 10, 0.1, 0.1, 4, 2).topology is None  # old constructor still works


def test_rejoin_keeps_the_departed_incarnations_stats():
    sim = Simulator(CFG, 6, seed=1)
    sim.send(2, 4, b"before")
    sim.run_until_idle()
    first = sim.node_stats()[2]
    assert first.packets_sent["real"] == 1
    sim.leave(2)
    sim.join(2)
    sim.run_until_idle()
    assert sim.incarnation(2) == 1 and sim.incarnation(0) == 0
    per_life = sim.incarnation_stats()
    assert per_life[(2, 0)] is first and per_life[(2, 0)].packets_sent["real"] == 1
    assert per_life[(2, 1)] is sim.node_stats()[2] and per_life[(2, 1)].packets_sent["real"] == 0
    assert per_life[(2, 1)].packets_sent["control"] > 0  # the JOIN of the new life
    assert {k for k in per_life if k[0] != 2} == {(i, 0) for i in range(6) if i != 2}
    with pytest.raises(ValueError, match="node_id"):
        sim.incarnation(99)


def test_fragment_capacity_is_exported_and_matches_the_documented_size():
    assert mixnet.fragment_capacity is mixnet.messages.fragment_capacity
    assert "fragment_capacity" in mixnet.__all__
    # 10,240 - 16 (zero prefix) - 29 (DATA header) - 301 (SURB): docs/unlinkable_dfl.md
    assert mixnet.fragment_capacity(PacketFormat(5, 10240)) == 9894


@pytest.mark.parametrize("mu", [0, 0.0, -0.1, float("nan"), float("inf")])
def test_mu_zero_or_invalid_is_refused_with_a_clear_error(mu):
    with pytest.raises(ValueError, match=r"mu must be a finite number > 0 seconds .*Poisson mixing delay"):
        MixnetConfig(mu=mu)
