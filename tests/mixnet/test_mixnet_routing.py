"""Route sampling follows its distribution; topologies have their defining properties."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from scipy import stats

from mixnet.routing import path_length_probabilities, sample_delays, sample_route
from mixnet.topology import TOPOLOGIES, circulant, full_mesh, make_topology, register_topology

N_SAMPLES = 6000
ALPHA = 1e-3


def test_path_lengths_uniform_on_1_to_K_chi_square():
    rng = random.Random(0)
    view = list(range(20))
    lengths = Counter(len(sample_route(view, 0, 1, 3, rng)) for _ in range(N_SAMPLES))
    observed = [lengths[k] for k in (1, 2, 3)]
    assert sum(observed) == N_SAMPLES
    assert stats.chisquare(observed).pvalue > ALPHA


def test_path_lengths_follow_weights_chi_square():
    rng = random.Random(1)
    weights = (0.2, 0.5, 0.3)
    lengths = Counter(len(sample_route(list(range(20)), 0, 1, 3, rng, weights)) for _ in range(N_SAMPLES))
    expected = [w * N_SAMPLES for w in weights]
    assert stats.chisquare([lengths[k] for k in (1, 2, 3)], expected).pvalue > ALPHA


def test_a_biased_length_distribution_is_detected():
    """The chi-square check has power: weights (0.4, 0.6) are rejected as uniform."""
    rng = random.Random(2)
    lengths = Counter(len(sample_route(list(range(20)), 0, 1, 2, rng, (0.4, 0.6))) for _ in range(N_SAMPLES))
    assert stats.chisquare([lengths[1], lengths[2]]).pvalue < ALPHA


def test_relays_uniform_over_view_minus_endpoints_chi_square():
    rng = random.Random(3)
    view = list(range(12))
    counts: Counter[int] = Counter()
    for _ in range(N_SAMPLES):
        route = sample_route(view, 4, 7, 3, rng)
        assert route[-1] == 7
        relays = route[:-1]
        assert len(set(relays)) == len(relays) and not {4, 7} & set(relays)
        counts.update(relays)
    eligible = [v for v in view if v not in (4, 7)]
    assert set(counts) == set(eligible)
    assert stats.chisquare([counts[v] for v in eligible]).pvalue > ALPHA


def test_path_is_shortened_when_view_is_small():
    rng = random.Random(4)
    assert {len(sample_route([0, 1, 2], 0, 1, 3, rng)) for _ in range(200)} == {1, 2}


def test_delays_are_exponential_with_mean_mu_ks():
    delays = sample_delays(4000, 0.1, random.Random(5))
    assert stats.kstest(delays, "expon", args=(0, 0.1)).pvalue > ALPHA


@pytest.mark.parametrize("bad, match", [((0, 1), "max_path_length"), ((2, [1.0]), "weights")])
def test_bad_parameters_name_the_parameter(bad, match):
    with pytest.raises(ValueError, match=match):
        path_length_probabilities(*bad)


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_every_topology_is_simple_undirected_and_connected(name):
    topo = make_topology(name, 16, 4, random.Random(0))
    assert topo.n == 16
    for i in range(topo.n):
        assert i not in topo.neighbours(i)
        assert all(i in topo.neighbours(j) for j in topo.neighbours(i))
    seen, frontier = {0}, [0]
    while frontier:
        nxt = [j for i in frontier for j in topo.neighbours(i) if j not in seen]
        seen.update(nxt)
        frontier = nxt
    assert len(seen) == 16


def test_circulant_hand_computed():
    topo = circulant(8, 4)
    assert topo.neighbours(0) == (1, 2, 6, 7)
    assert topo.neighbours(5) == (3, 4, 6, 7)
    assert set(topo.degrees()) == {4}


def test_full_mesh_and_random_regular_degrees():
    assert set(full_mesh(6).degrees()) == {5}
    rr = make_topology("random-regular", 20, 3, random.Random(9))
    assert set(rr.degrees()) == {3}
    assert rr == make_topology("random-regular", 20, 3, random.Random(9))


def test_topology_parameters_are_validated_and_registry_refuses_duplicates():
    with pytest.raises(ValueError, match="degree"):
        circulant(10, 3)
    with pytest.raises(ValueError, match="rng"):
        make_topology("random-regular", 10, 4)
    with pytest.raises(ValueError, match="topology must be one of"):
        make_topology("torus", 10)
    with pytest.raises(ValueError, match="already registered"):
        register_topology("circulant", circulant)


def _route_with_a_list(candidates, src, dst, max_path_length, rng, weights=None):
    """The routing before issue 40: an O(N) list of eligible relays for every packet."""
    probs = path_length_probabilities(max_path_length, weights)
    k = rng.choices(range(1, max_path_length + 1), weights=probs)[0]
    eligible = [c for c in candidates if c != src and c != dst]
    k = min(k, len(eligible) + 1)
    return rng.sample(eligible, k - 1) + [dst]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 21, 22, 23, 40, 1024])
def test_routes_are_those_of_the_eligible_list_draw_for_draw(n):
    """Same seed, same routes as the list it replaced (so every kept mixnet result stands), at view sizes on both
    sides of random.sample's small-population copy (21), with src / dst in or out of the view."""
    pick = random.Random(n)
    for trial in range(300):
        view = sorted(pick.sample(range(3 * n + 5), n))
        src = pick.choice(view + [10_000])  # the sender is never in its own view; tests pass it in too
        dst = pick.choice(view)
        k = pick.randint(1, 4)
        weights = None if trial % 2 else [pick.random() + 0.01 for _ in range(k)]
        a, b = random.Random(trial), random.Random(trial)
        for _ in range(5):
            assert sample_route(view, src, dst, k, a, weights) == _route_with_a_list(view, src, dst, k, b, weights)
        assert a.getstate() == b.getstate()


def test_the_excluding_view_indexes_like_the_list():
    from mixnet.routing import Excluding

    items = [1, 3, 4, 8, 9, 12]
    for excluded in [(), (1,), (12,), (4, 9), (9, 4), (1, 12), (5,), (3, 3)]:
        want = [v for v in items if v not in excluded]
        got = Excluding(items, excluded)
        assert len(got) == len(want) and [got[i] for i in range(len(got))] == want
        assert [got[-i] for i in range(1, len(got) + 1)] == want[::-1]
        with pytest.raises(IndexError):
            got[len(want)]
