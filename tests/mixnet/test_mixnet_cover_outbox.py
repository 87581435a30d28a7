"""Cover packets look and behave like real ones; the outbox mixes in batches of O."""

from __future__ import annotations

import random
import statistics

import pytest
from scipy import stats

from mixnet.config import MixnetConfig
from mixnet.crypto import SeededRandomSource
from mixnet.messages import Cover, DataFragment, decode_message, encode_cover, encode_data
from mixnet.outbox import Outbox, OutboxItem, mix_batch, release_delays
from mixnet.packet import Deliver, Forward, create_packet, process_packet
from mixnet.simulator import Simulator
from mixnet.surb import create_surb
from mixnet.testing import SMALL_FORMAT, make_hops, make_keys, walk

KEYS = make_keys(4, seed=6)
HOPS = make_hops(KEYS)


def test_cover_and_real_packets_are_identical_in_length_and_relay_handling():
    rng = SeededRandomSource(2)
    surb, _ = create_surb(SMALL_FORMAT, [HOPS[2], HOPS[0]], [0.1], rng)
    real_plain = encode_data(SMALL_FORMAT, DataFragment(b"m" * 16, 0, 1, surb, b"weights"))
    real = create_packet(SMALL_FORMAT, [HOPS[1], HOPS[3]], [0.2], real_plain, rng)
    cover = create_packet(SMALL_FORMAT, [HOPS[1], HOPS[3]], [0.2], encode_cover(), rng)
    assert len(real) == len(cover) == SMALL_FORMAT.packet_size
    relay_real = process_packet(SMALL_FORMAT, KEYS[1], real)
    relay_cover = process_packet(SMALL_FORMAT, KEYS[1], cover)
    # The relay gets the same kind of result, same next hop, delay and size: it cannot tell them apart.
    assert type(relay_real) is type(relay_cover) is Forward
    assert (relay_real.next_hop, relay_real.delay, len(relay_real.packet)) == \
           (relay_cover.next_hop, relay_cover.delay, len(relay_cover.packet))
    # Only the destination, after the last layer, sees the difference.
    final_cover, _, _ = walk(SMALL_FORMAT, KEYS, 1, cover)
    assert isinstance(final_cover, Deliver) and isinstance(decode_message(SMALL_FORMAT, final_cover.plaintext), Cover)


def test_on_the_wire_every_packet_kind_has_one_size_and_batches_have_O_packets():
    cfg = MixnetConfig(max_path_length=2, outbox_size=5, payload_size=1024, mu=0.05, cover_policy="all")
    sim = Simulator(cfg, 6, seed=4)
    sim.send(0, 3, b"real data")
    sim.run_until_idle()
    view, truth = sim.adversary_view(), sim.ground_truth()
    kinds_by_size: dict[int, set[str]] = {}
    for rec, gt in zip(view.records, truth.records):
        kinds_by_size.setdefault(rec.size, set()).add(gt.kind)
    assert kinds_by_size == {cfg.packet_format.packet_size + 1: {"real", "cover", "ack", "relay"}}
    first_batch = [r for r in view.records if r.src == 0 and r.time <= cfg.effective_fill_timeout + 1.0]
    stats_0 = sim.node_stats()[0]
    assert stats_0.packets_sent["real"] == 1 and stats_0.packets_sent["cover"] >= cfg.outbox_size - 1
    assert len(first_batch) >= cfg.outbox_size
    # Cover reaching a destination is dropped silently, never delivered.
    assert sum(s.cover_received for s in sim.node_stats().values()) > 0
    assert sum(len(sim.inbox(i)) for i in sim.nodes) == 1


def test_cover_off_sends_no_cover():
    with pytest.warns(UserWarning, match="cover_traffic is off"):
        cfg = MixnetConfig(max_path_length=2, outbox_size=5, payload_size=1024, cover_traffic=False)
    sim = Simulator(cfg, 5, seed=1)
    sim.send(0, 1, b"x")
    sim.run_until_idle()
    assert sum(s.packets_sent["cover"] for s in sim.node_stats().values()) == 0
    assert [m.data for m in sim.inbox(1)] == [b"x"]


def _item(k: int, delay: float | None = None) -> OutboxItem:
    return OutboxItem(next_hop=k, packet=b"p%d" % k, kind="relay" if delay is not None else "real", delay=delay)


def test_mix_batch_pads_to_O_and_shuffles_uniformly():
    rng = random.Random(0)
    first_positions = []
    for _ in range(3000):
        batch = mix_batch([_item(0), _item(1)], 4, True, lambda: _item(9), rng)
        assert len(batch) == 4 and sum(it.next_hop == 9 for it in batch) == 2
        first_positions.append([it.next_hop for it in batch].index(0))
    counts = [first_positions.count(p) for p in range(4)]
    assert stats.chisquare(counts).pvalue > 1e-3


def test_outbox_takes_batches_of_at_most_O():
    box = Outbox(3)
    for k in range(7):
        box.push(_item(k))
    assert box.full
    assert [it.next_hop for it in box.take_batch()] == [0, 1, 2]
    assert len(box) == 4
    with pytest.raises(ValueError, match="size"):
        Outbox(0)


def test_release_delays_exponential_mu_plus_gaussian_sigma_jitter():
    rng = random.Random(1)
    own = release_delays([_item(k) for k in range(4000)], mu=0.1, sigma=0.0, rng=rng)
    assert stats.kstest(own, "expon", args=(0, 0.1)).pvalue > 1e-3
    relayed = release_delays([_item(k, delay=0.5) for k in range(4000)], mu=0.1, sigma=0.01, rng=rng)
    assert statistics.fmean(relayed) == pytest.approx(0.5, abs=0.001)
    assert statistics.stdev(relayed) == pytest.approx(0.01, rel=0.05)
    assert min(release_delays([_item(k, delay=0.0) for k in range(100)], 0.1, 0.5, rng)) >= 0.0
