"""Drift detection: the divergence metric, the robust flagging rule, and a poisoned client caught in a real run."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacy.drift import detect_drift, detection_rates, pairwise_divergence, robust_z_scores


def test_divergence_hand_cases():
    d = pairwise_divergence([np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([3.0, 4.0])])
    assert d[0, 1] == pytest.approx(math.sqrt(2) / 1.0)
    # ||(1,0) - (3,4)|| = sqrt(20), mean norm (1 + 5) / 2 = 3
    assert d[0, 2] == pytest.approx(math.sqrt(20) / 3)
    assert np.allclose(d, d.T) and np.all(np.diag(d) == 0)
    assert pairwise_divergence([np.ones(3), np.ones(3)])[0, 1] == 0
    with pytest.raises(ValueError, match="all-zero"):
        pairwise_divergence([np.zeros(2), np.ones(2)])
    with pytest.raises(ValueError, match="at least two"):
        pairwise_divergence([np.ones(2)])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=4, max_size=4), st.lists(st.floats(-5, 5), min_size=4, max_size=4),
       st.floats(0.1, 100))
def test_divergence_is_scale_invariant_and_bounded(a, b, scale):
    a, b = np.array(a), np.array(b)
    if np.linalg.norm(a) < 1e-3 or np.linalg.norm(b) < 1e-3:
        return
    d = pairwise_divergence([a, b])[0, 1]
    assert pairwise_divergence([scale * a, scale * b])[0, 1] == pytest.approx(d, rel=1e-9, abs=1e-12)
    assert 0 <= d <= 2 + 1e-12  # ||a - b|| <= ||a|| + ||b|| = 2 * mean norm


def test_robust_z_hand_case_and_mad_zero_fallback():
    # median 2, |x - 2| = (1, 0, 0, 8) -> MAD 0.5; z of 10 = 0.6745 * 8 / 0.5
    z = robust_z_scores([1.0, 2.0, 2.0, 10.0])
    assert z[3] == pytest.approx(0.6745 * 8 / 0.5) and z[1] == 0
    # more than half tie -> MAD 0 -> mean absolute deviation (8 / 5) * 1.2533
    z = robust_z_scores([1.0, 1.0, 1.0, 1.0, 9.0])
    assert z[4] == pytest.approx(8 / (1.2533 * 8 / 5))
    assert np.all(robust_z_scores([3.0, 3.0, 3.0]) == 0)


def test_detector_flags_the_outlier_and_nobody_in_a_clean_cohort():
    rng = np.random.default_rng(0)
    base = rng.normal(size=500)
    false_pos = z_only = 0
    for trial in range(50):
        honest = [base + rng.normal(scale=0.05, size=500) for _ in range(9)]
        drifted = base + rng.normal(scale=0.05, size=500) + 0.5 * rng.normal(size=500)
        models = honest[:trial % 9] + [drifted] + honest[trial % 9:]
        rep = detect_drift(list(range(10)), models)
        assert rep.flagged == (trial % 9,)
        false_pos += len(detect_drift(list(range(9)), honest).flagged)
        z_only += len(detect_drift(list(range(9)), honest, min_ratio=1.0).flagged)
    assert false_pos == 0
    assert z_only > 0  # the z-score alone raises false alarms on interchangeable clients: why min_ratio exists
    assert detect_drift([0, 1], [base, base + 1]).flagged == ()  # no "rest" to compare with


def test_detection_rates_count_hits_and_false_positives():
    r = detection_rates(flagged=[[3], [3, 5], [], []], poisoned=[3, 3, 4, None],
                        participants=[range(10), range(10), range(10), range(10)])
    assert (r["detections"], r["poisoned_runs"], r["detection_rate"]) == (2, 3, 2 / 3)
    assert (r["false_positives"], r["honest_client_checks"]) == (1, 9 + 9 + 9 + 10)


# Shifted targets need 2 local epochs to show: in the first epoch Adam's steps (about lr * sign(g))
# move every client the same way (all must raise their output from ~0), whatever the target level.
@pytest.mark.parametrize("poison,client,seed,epochs", [("shift-targets", 7, 0, 2), ("scale-features", 2, 1, 1)])
def test_poisoned_client_is_flagged_in_a_detection_run(tmp_path, fake_grid_cls, poison, client, seed, epochs):
    """server_main with detection only (tab-settings=''), clients answering through Flower messages."""
    import torch

    from flower_apps.router import client_app
    from flower_apps.tabular_pdp.config import config_for as make_cfg
    from flower_apps.tabular_pdp.server_app import server_main

    torch.set_num_threads(1)
    cfg = make_cfg(**{"tab-settings": "", "tab-poison": poison, "tab-poison-client": client, "seed": seed,
                      "tab-levels": "2,1,0,0", "local-epochs": epochs, "results-dir": str(tmp_path)})
    grid = fake_grid_cls(list(range(10)), lambda node, msg: client_app(msg, None))
    s = server_main(grid, cfg)
    assert s["drift"]["flagged"] == [client]
    assert max(z for c, z in zip(s["drift"]["client_ids"], s["drift"]["z_scores"]) if c != client) < 3.5
    assert client not in s["participants"] and len(s["participants"]) == 9
    assert s["settings"] == {} and (tmp_path / "tabular-pdp" / "runs" / s["run"] / "drift_heatmap.png").is_file()


def test_drift_recheck_every_x_rounds_excludes_the_drifted_client(rng, fake_grid_cls):
    from collections import OrderedDict

    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    from flower_apps.tabular_pdp.strategy import CohortFedAvg
    from strategies.drift_guard import DriftGuard

    w = rng.normal(size=200)
    models = [w + rng.normal(scale=0.01, size=200) for _ in range(5)] + [w + 1.0]

    def handler(node, msg):
        cid = int(msg.content["config"]["client-ids"][0])
        return Message(RecordDict({"arrays": ArrayRecord(OrderedDict({"w": Array(models[cid].astype(np.float32))})),
                                   "metrics": MetricRecord({"num-examples": 10, "train-loss": 0.0}),
                                   "info": ConfigRecord({"client-id": cid})}), reply_to=msg)

    def one_round(rnd):
        grid = fake_grid_cls(list(range(100, 106)), handler)
        msgs = list(guard.configure_train(rnd, ArrayRecord(OrderedDict({"w": Array(w.astype(np.float32))})),
                                          ConfigRecord(), grid))
        return guard.aggregate_train(rnd, grid.send_and_receive(msgs))

    base = CohortFedAvg(list(range(6)), "x")
    guard = DriftGuard(base, base, every=2, threshold=3.5)
    agg1, _ = one_round(1)  # round 1: not checked
    assert base.client_ids == list(range(6)) and 1 not in guard.reports
    agg2, _ = one_round(2)
    assert guard.reports[2].flagged == (5,) and base.client_ids == [0, 1, 2, 3, 4]
    assert base.contributors[2] == [0, 1, 2, 3, 4]
    assert np.allclose(agg2["w"].numpy(), np.mean(models[:5], axis=0), atol=1e-6)
    assert not np.allclose(agg1["w"].numpy(), agg2["w"].numpy(), atol=1e-3)
