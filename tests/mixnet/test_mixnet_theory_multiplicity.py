"""The multiplicity form of gamma_T (issue 39's reading of the paper) beside our chain-following form.

Hand-computed cases, a case where the two forms differ (both ways), the trajectory count on a hand-built
trace, and its agreement with the flow-correlation attack's trace-consistent candidates on a simulated one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attacks.linking.scoring import fragment_targets
from attacks.linking.timing import LinkingGuess, _TraceIndex, flow_correlation_attack
from attacks.linking.trajectories import _per_origin, trajectory_counts
from flower_apps.unlinkable_dfl.netexp import TrafficSpec, linking_scores, run_traffic
from mixnet.theory import chain_following_gamma, path_length_prior
from mixnet.theory_multiplicity import multiplicity_bound, multiplicity_gamma, multiplicity_row
from mixnet.trace import AdversaryView, TraceRecord


def test_multiplicity_gamma_hand_computed():
    assert multiplicity_gamma(3, math.log2(10)) == pytest.approx(0.3)
    assert multiplicity_gamma(1, 0.0) == 1.0  # no mix, one trajectory: the sender is exposed
    assert multiplicity_gamma(64, 4.0) == pytest.approx(4.0)  # a count, not a probability
    assert multiplicity_bound([2, 4, 6], 2.0) == pytest.approx(4 / 4)


def test_the_two_forms_differ_both_ways():
    h, pi = math.log2(10), path_length_prior(2)
    ours = chain_following_gamma(h, pi)
    assert ours == pytest.approx(0.5 + 0.5 * 0.1)  # a probability: 1-hop share + followed 2-hop share
    few, many = multiplicity_gamma(3, h), multiplicity_gamma(30, h)
    assert few == pytest.approx(0.3) and few < ours  # few feasible trajectories: below ours
    assert many == pytest.approx(3.0) and many > 1 > ours  # many: above 1, vacuous


def test_multiplicity_row_hand_computed():
    counts, hits, base = [2, 8, 16], [1, 1, 0], [0.25, 0.25, 0.5]
    row = multiplicity_row(counts, 3.0, hits, base)  # gamma_T = 0.25, 1.0, 2.0
    assert row.mean_trajectories == pytest.approx(26 / 3) and row.bound == pytest.approx(3.25 / 3)
    assert row.informative == pytest.approx(1 / 3)  # only gamma_T = 0.25 is < 1
    assert row.informative_bound == pytest.approx(0.25) and row.informative_advantage == pytest.approx(0.75)
    d = row.as_dict("agnostic_trace")
    assert d["agnostic_trace_mult_bound"] == row.bound and len(d) == 6
    none_small = multiplicity_row([8, 16], 3.0, [1, 0], [0.5, 0.5])
    assert none_small.informative == 0 and math.isnan(none_small.informative_advantage)


@pytest.mark.parametrize("bad", [dict(h=-1.0), dict(h=float("nan")), dict(n=[]), dict(n=[-1]), dict(n=[np.inf])])
def test_bad_multiplicity_input_is_refused(bad):
    with pytest.raises(ValueError):
        multiplicity_bound(bad.get("n", [1]), bad.get("h", 1.0))
    with pytest.raises(ValueError, match="one value per target"):
        multiplicity_row([1, 1], 1.0, [1], [0.5])


def _hand_view(max_path_length: int) -> AdversaryView:
    size = 100
    records = (
        TraceRecord(0.0, 1, 9, size, 0.5),  # 0: three inputs to relay 9 ...
        TraceRecord(0.0, 2, 9, size, 0.5),  # 1
        TraceRecord(0.1, 3, 9, size, 0.6),  # 2
        TraceRecord(0.2, 5, 9, size, 0.7),  # 3: ... one from D = 5 (never a predecessor on the path to 5)
        TraceRecord(0.3, 4, 9, 40, 0.8),  # 4: an ack-sized frame (not a packet)
        TraceRecord(1.0, 9, 5, size, 1.01),  # 5: the target, delivered to D = 5
        TraceRecord(1.5, 6, 9, size, 1.6),  # 6: arrives after the target left (not a predecessor)
        TraceRecord(-0.4, 7, 1, size, -0.3),  # 7: an input to node 1 before it sent frame 0
    )
    return AdversaryView(records, size, mu=0.2, fill_timeout=0.0, outbox_size=2, max_path_length=max_path_length)


def test_trajectory_count_hand_computed():
    # K = 2: [9], 1 -> 9, 2 -> 9, 3 -> 9; not 5 -> 9 (from D), not the ack, not the frame that came later
    view = _hand_view(2)
    (guess,) = flow_correlation_attack(view, [5])
    assert guess.anonymity == {1, 2, 3, 7, 9}  # senders of packets in the K horizons before, less D
    assert trajectory_counts(view, [guess]).tolist() == [4.0]
    # K = 3 adds 7 -> 1 -> 9 (frame 7 reached node 1 before frame 0 left it)
    view3 = _hand_view(3)
    (g3,) = flow_correlation_attack(view3, [5])
    assert trajectory_counts(view3, [g3]).tolist() == [5.0]
    # origins outside U_T do not count: with U_T = {1, 9}, only [9] and 1 -> 9 remain
    restricted = LinkingGuess(g3.target, g3.guess, frozenset({1, 9}), g3.candidates, g3.posterior)
    assert trajectory_counts(view3, [restricted]).tolist() == [2.0]


def test_trajectory_origins_are_the_attacks_candidates_on_a_simulated_trace():
    """The chains counted are the ones the flow-correlation attack weighs: their origins are its C_T."""
    spec = TrafficSpec(num_nodes=8, fragments_per_peer=2, max_hops=3, outbox=5)
    sim, ids, _ = run_traffic(spec)
    view, truth, records = sim.adversary_view(), sim.ground_truth(), sim.message_records()
    targets = fragment_targets(view, truth, {(records[m].src, records[m].dst) for m in ids})
    guesses = flow_correlation_attack(view, [t.frame for t in targets])
    index, memo = _TraceIndex(view), {}
    checked = 0
    for g in guesses:
        per = _per_origin(index, g.target, view.max_path_length, memo)
        origins = {s for s in g.anonymity if per[s] > 0}
        if origins:  # (the attack falls back to U_T when no chain reaches it)
            assert origins == set(g.candidates)
            checked += 1
    assert checked > 50
    counts = trajectory_counts(view, guesses)
    assert (counts >= np.asarray([len(g.candidates) for g in guesses])).all()
    row = linking_scores(sim, ids, spec.seed)
    for adv in ("agnostic", "aware"):
        assert row[f"{adv}_trace_mult_bound"] == pytest.approx(
            row[f"{adv}_trace_mult_trajectories"] * 2 ** -row[f"{adv}_trace_mult_h_inf_bits"])
