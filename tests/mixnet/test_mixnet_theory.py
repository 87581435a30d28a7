"""Theory beside measurement: H_inf, our chain-following gamma_T and bound (with colluding relays), and
measured advantage <= bound. (Not the paper's Theorem 1: see mixnet.theory's docstring and issue 39.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flower_apps.unlinkable_dfl.netexp import TrafficSpec, linking_scores, run_traffic
from mixnet.metrics import relay_min_entropy
from mixnet.theory import (
    chain_following_bound,
    chain_following_gamma,
    ideal_relay_min_entropy,
    min_entropy,
    path_length_prior,
    theory_row,
)
from mixnet.trace import AdversaryView, TraceRecord


def test_min_entropy_hand_computed():
    assert min_entropy([0.25] * 4) == pytest.approx(2.0)
    assert min_entropy([2, 1, 1]) == pytest.approx(1.0)  # normalised: max p = 1/2
    assert ideal_relay_min_entropy(100) == pytest.approx(math.log2(100))
    with pytest.raises(ValueError, match="probabilities"):
        min_entropy([])


def test_gamma_and_bounds_hand_computed():
    pi2, pi3 = path_length_prior(2), path_length_prior(3)
    assert chain_following_gamma(math.log2(10), pi2) == pytest.approx(0.5 + 0.5 * 0.1)
    assert chain_following_gamma(5.0, path_length_prior(1)) == 1.0  # one hop: the delivering link is the sender
    per_hop = 0.25 + 0.75 * 0.1  # colluding relays, c = 0.25, p = 1/10
    assert chain_following_gamma(math.log2(10), pi3, 0.25) == pytest.approx((1 + per_hop + per_hop**2) / 3)
    assert chain_following_gamma(math.log2(10), pi3, 1.0) == pytest.approx(1.0)
    assert chain_following_bound(0.55, [4, 10]) == pytest.approx(0.55 * (1 - (0.25 + 0.1) / 2))
    row = theory_row(math.log2(10), pi2, [4], compromised=(0.5,))
    assert row.bound == pytest.approx(0.55 * 0.75) and row.bound_compromised[0.5] > row.bound
    assert path_length_prior(2, [3, 1]).tolist() == [0.75, 0.25]


def test_gamma_decreases_with_mixing_and_path_length_and_grows_with_compromise():
    hs = np.linspace(0, 8, 9)
    for k in (2, 3, 4):
        g = [chain_following_gamma(h, path_length_prior(k)) for h in hs]
        assert all(a > b for a, b in zip(g, g[1:]))
    assert chain_following_gamma(3.0, path_length_prior(3)) < chain_following_gamma(3.0, path_length_prior(2))
    cs = [chain_following_gamma(3.0, path_length_prior(3), c) for c in (0, 0.1, 0.5, 1)]
    assert all(a < b for a, b in zip(cs, cs[1:]))


@pytest.mark.parametrize("bad", [dict(h_inf=-1.0), dict(h_inf=float("nan")), dict(compromised=1.5),
                                 dict(prior=[0.5, 0.4])])
def test_bad_theory_input_is_refused(bad):
    args = {"h_inf": 1.0, "prior": path_length_prior(2), "compromised": 0.0, **bad}
    with pytest.raises(ValueError):
        chain_following_gamma(args["h_inf"], args["prior"], args["compromised"])


def test_relay_min_entropy_hand_computed():
    size = 100
    records = (TraceRecord(0.0, 1, 9, size, 0.5), TraceRecord(0.0, 2, 9, size, 0.5),  # two simultaneous inputs
               TraceRecord(1.0, 9, 3, size, 1.01))
    view = AdversaryView(records, size, mu=0.2, fill_timeout=0.0, outbox_size=2, max_path_length=2)
    got = relay_min_entropy(view, [9])
    assert got.outputs == 1 and got.guess_probability == pytest.approx(0.5) and got.h_inf_bits == pytest.approx(1.0)


@pytest.mark.parametrize("spec", [
    TrafficSpec(num_nodes=8, fragments_per_peer=3, mixnet=False),
    TrafficSpec(num_nodes=8, fragments_per_peer=3, max_hops=2, outbox=5),
    TrafficSpec(num_nodes=8, fragments_per_peer=3, max_hops=2, outbox=10, seed=1),
    TrafficSpec(num_nodes=8, fragments_per_peer=3, max_hops=3, outbox=10),
], ids=lambda s: s.label)
def test_measured_advantage_does_not_exceed_the_chain_following_bound(spec):
    sim, ids, _ = run_traffic(spec)
    row = linking_scores(sim, ids, spec.seed)
    for adv in ("agnostic", "aware"):
        assert row[f"{adv}_targets"] > 50
        assert row[f"{adv}_advantage"] <= row[f"{adv}_trace_bound"] + 1e-9
        assert row[f"{adv}_advantage"] <= row[f"{adv}_trace_bound_c0.25"] + 1e-9
        assert 0 < row[f"{adv}_trace_gamma"] <= 1
    if not spec.mixnet:  # no relay: gamma = 1 and the bound is met with equality (every sender exposed)
        assert row["agnostic_trace_gamma"] == 1.0
        assert row["agnostic_advantage"] == pytest.approx(row["agnostic_trace_bound"])
    else:  # a real mix: the bound is informative (< 1) and the relays hide something
        assert row["agnostic_trace_bound"] < 0.8 and row["relay_h_inf_bits"] > 1.0
