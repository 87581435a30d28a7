"""Sender linking on the mixnet trace, and curious-recipient content linking."""

import numpy as np
import pytest

from attacks.linking.content import CuriousRecipientView, RoundObservation, link_by_content, score_content_linking
from attacks.linking.scoring import fragment_targets, score_linking
from attacks.linking.timing import flow_correlation_attack
from flower_apps.unlinkable_dfl.netexp import TrafficSpec, run_traffic
from privacy.fragments import Fragment


def _attack(spec: TrafficSpec, aware: bool):
    sim, ids, _ = run_traffic(spec)
    view, truth = sim.adversary_view(), sim.ground_truth()
    recs = sim.message_records()
    targets = fragment_targets(view, truth, {(recs[m].src, recs[m].dst) for m in ids})
    guesses = flow_correlation_attack(view, [t.frame for t in targets], sim.topology.adjacency if aware else None,
                                      np.random.default_rng(0))
    return targets, score_linking(guesses, targets)


def test_targets_are_every_delivered_fragment_packet():
    spec = TrafficSpec(num_nodes=6, fragments_per_peer=2, max_hops=2, outbox=5)
    targets, _ = _attack(spec, aware=False)
    assert len(targets) == 6 * 4 * 2  # degree 4, 2 fragments per neighbour, all delivered, no retransmission
    assert all(t.sender != t.receiver for t in targets)


@pytest.mark.parametrize("aware", [False, True])
def test_linking_beats_chance_without_mixnet_and_drops_toward_it_with_mixnet(aware):
    off_t, off = _attack(TrafficSpec(num_nodes=8, fragments_per_peer=3, mixnet=False), aware)
    _, on = _attack(TrafficSpec(num_nodes=8, fragments_per_peer=3, max_hops=3, outbox=10), aware)
    # mixnet off: the delivering link exposes every sender (the candidate set is the sender alone)
    assert off.accuracy == 1.0 and off.exposed == 1.0 and off.advantage > 0.5
    # mixnet on (K = 3): guesses fall towards the 1/|U_T| baseline; candidate sets stay large
    assert on.accuracy < 0.6 and on.advantage < off.advantage - 0.4
    assert on.mean_candidates > 3 and on.sender_in_candidates > 0.95
    assert on.baseline == pytest.approx(off.baseline, abs=0.1)


def test_content_linking_hand_made_case(rng):
    # three senders with orthogonal update directions; fragments = local + own direction + small noise
    dim = 60
    dirs = {s: np.eye(3)[s].repeat(dim // 3) + 0.05 * rng.standard_normal(dim) for s in (0, 1, 2)}
    local = rng.standard_normal(dim)
    view_rounds, truth = [], []
    for t in (2, 3):
        local_t = local + 0.1 * t
        frags, who = [], []
        for s in (0, 1, 2):
            for a in (0, 20, 40):
                vals = local_t[a:a + 20] + dirs[s][a:a + 20] + 0.01 * rng.standard_normal(20)
                frags.append(Fragment(t, a, vals.astype(np.float32)))
                who.append(s)
        order = rng.permutation(len(frags))
        view_rounds.append(RoundObservation(t, local_t, tuple(frags[k] for k in order)))
        truth.append([who[k] for k in order])
    view = CuriousRecipientView({s: local + dirs[s] for s in dirs}, local, tuple(view_rounds))
    score = score_content_linking(link_by_content(view), truth, 3)
    assert score["identity_accuracy"] == 1.0 and score["bucket_accuracy"] == 1.0 and score["chance"] == 1 / 3
    # with indistinguishable senders (same direction) linking is no better than chance on average
    same = CuriousRecipientView({s: local + dirs[0] for s in dirs}, local, tuple(view_rounds))
    assert score_content_linking(link_by_content(same), truth, 3)["identity_accuracy"] < 0.7
