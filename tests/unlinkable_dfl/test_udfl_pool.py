"""Fragment pool, FragFedAvg and FragKrum."""

import numpy as np
import pytest

from flower_apps.unlinkable_dfl.fragment_pool import AGGREGATORS, FragmentPool, frag_fedavg, frag_krum, krum_select
from privacy.fragments import Fragment, FragmentLayout, encode, split


def _encoded(vec, layout, round_=1, encoding="float32", rng=None):
    return [encode(f, encoding, rng) for f in split(vec, layout, round_)]


def test_fragfedavg_equals_fedavg_with_full_coverage_and_no_quantization(rng):
    layout = FragmentLayout(1_000, 128)
    local, *peers = [rng.standard_normal(1_000).astype(np.float32) for _ in range(5)]
    pool = FragmentPool(local, layout, 1)
    for p in peers:
        for data in _encoded(p, layout):
            assert pool.add_bytes(data) == "added"
    out, stats = frag_fedavg(pool)
    fedavg = np.mean(np.stack([local, *peers]).astype(np.float64), axis=0)
    np.testing.assert_allclose(out, fedavg, rtol=0, atol=1e-6)
    assert stats.coverage == 1.0 and stats.peer_fragments == 4 * layout.count


def test_fragfedavg_hand_computed_partial_coverage():
    layout = FragmentLayout(6, 2)
    pool = FragmentPool(np.zeros(6, dtype=np.float32), layout, 2)
    pool.add(Fragment(2, 0, np.array([2.0, 4.0], dtype=np.float32)))  # range 0 from peer A
    pool.add(Fragment(2, 0, np.array([4.0, 8.0], dtype=np.float32)))  # range 0 from peer B
    pool.add(Fragment(2, 4, np.array([3.0, 3.0], dtype=np.float32)))  # range 2 from peer A
    out, stats = frag_fedavg(pool)
    assert out.tolist() == [2.0, 4.0, 0.0, 0.0, 1.5, 1.5]  # range 1: no peer, keeps the local value
    assert stats.coverage == pytest.approx(4 / 6) and stats.ranges_with_peers == 2


def test_pool_deduplicates_and_drops_stale_and_misaligned(rng):
    layout = FragmentLayout(8, 4)
    pool = FragmentPool(np.zeros(8, dtype=np.float32), layout, 3)
    frag = _encoded(np.ones(8, dtype=np.float32), layout, 3)[0]
    assert pool.add_bytes(frag) == "added"
    assert pool.add_bytes(frag) == "duplicate"  # same bytes: replay or double delivery
    assert pool.add(Fragment(3, 0, np.ones(4, dtype=np.float32))) == "duplicate"  # same content, decoded
    assert pool.add_bytes(_encoded(np.ones(8, dtype=np.float32), layout, 2)[0]) == "stale"
    assert pool.add(Fragment(3, 2, np.ones(4, dtype=np.float32))) == "invalid"  # not a layout range
    assert pool.add_bytes(b"garbage") == "invalid"
    out, stats = frag_fedavg(pool)
    assert out[:4].tolist() == [0.5] * 4  # one copy counted, not two
    assert (stats.duplicates, stats.stale, stats.invalid) == (2, 1, 2)


def test_krum_select_hand_computed():
    # 1-D candidates 0, 1, 2, 3, 100 with B = 1: scores over the n - B - 2 = 2 nearest
    # others: 0 -> 1 + 4 = 5, 1 -> 1 + 1 = 2, 2 -> 1 + 1 = 2, 3 -> 1 + 4 = 5, 100 -> huge.
    cands = np.array([[0.0], [1.0], [2.0], [3.0], [100.0]])
    assert krum_select(cands, 1) == 1
    with pytest.raises(ValueError, match="n > 2 B \\+ 2"):
        krum_select(cands[:4], 1)


def test_fragkrum_keeps_the_honest_slice_where_fedavg_is_dragged_away(rng):
    layout = FragmentLayout(20, 10)
    local = np.ones(20, dtype=np.float32)
    honest = [np.ones(20, dtype=np.float32) + 0.01 * rng.standard_normal(20).astype(np.float32) for _ in range(4)]
    byz = np.full(20, 100.0, dtype=np.float32)
    pools = []
    for _ in range(2):
        pool = FragmentPool(local, layout, 1)
        for v in [*honest, byz]:
            for f in split(v, layout, 1):
                pool.add(f)
        pools.append(pool)
    krum, stats = frag_krum(pools[0], budget=1)
    avg, _ = frag_fedavg(pools[1])
    assert np.abs(krum - 1).max() < 0.1 and stats.krum_ranges == 2 and stats.fallback_ranges == 0
    assert avg.min() > 10  # FedAvg is pulled towards the Byzantine value


def test_fragkrum_falls_back_when_the_honest_majority_condition_fails():
    layout = FragmentLayout(3, 3)
    pool = FragmentPool(np.array([1.0, 1.0, 1.0], dtype=np.float32), layout, 1)
    for v in ([2.0, 2.0, 2.0], [3.0, 3.0, 3.0], [50.0, 50.0, 50.0]):  # n_r = 4 <= 2 B + 2 with B = 1
        pool.add(Fragment(1, 0, np.asarray(v, dtype=np.float32)))
    out, stats = frag_krum(pool, budget=1, fallback="median")
    assert out.tolist() == [2.5, 2.5, 2.5]  # coordinate-wise median of 1, 2, 3, 50
    assert stats.fallback_ranges == 1 and stats.krum_ranges == 0
    pool2 = FragmentPool(pool.local, layout, 1, received={0: list(pool.received[0])})
    out2, stats2 = frag_krum(pool2, budget=1, fallback="fedavg")
    assert out2.tolist() == [14.0, 14.0, 14.0] and stats2.fallback_ranges == 1


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_every_aggregator_keeps_the_local_state_without_peers(name, rng):
    local = rng.standard_normal(50).astype(np.float32)
    out, stats = AGGREGATORS[name](FragmentPool(local, FragmentLayout(50, 20), 1))
    assert np.array_equal(out, local) and stats.coverage == 0.0 and stats.fallback_ranges == 0


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_every_aggregator_ignores_the_order_fragments_arrive_in(name, rng):
    layout = FragmentLayout(30, 7)
    local = rng.standard_normal(30).astype(np.float32)
    frags = [f for _ in range(5) for f in split(rng.standard_normal(30).astype(np.float32), layout, 1)]
    outs = []
    for order in (range(len(frags)), rng.permutation(len(frags))):
        pool = FragmentPool(local, layout, 1)
        for k in order:
            pool.add(frags[k])
        outs.append(AGGREGATORS[name](pool)[0])
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6)
    assert not np.allclose(outs[0], local)
