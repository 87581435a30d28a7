"""dfl-dp's audit can fail (issue 37): each broken matched perturbation is a violation, the mechanism is not.

Unit tests: each fault of ``MatchedPerturbation`` changes what it should and nothing else (fake grid,
seeded noise, a 9-parameter model). End to end: the smoke preset through Flower's simulation with
the trial's 100 audit canaries (flower_apps.dfl_dp.audit_trial.TRIAL_CANARIES: 50 held-out canaries
over 2 releases give the noise tests 100 projections; the sweep's default of 200 is not needed at
smoke scale), every fault in FL and in sequential DFL, one simulation for all runs.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from privacy.audit import CanarySet
from privacy.faults import ALLOW_ENV, FAULTS_BY_STUDY, WRONG_COHORT_FACTOR
from privacy.mechanisms import calibrate_sigma_abs
from privacy.randomness import NoiseSource
from strategies.fedavg_equal import EqualWeightFedAvg
from strategies.matched_perturbation import MatchedPerturbation
from strategies.records import client_key, from_numpy, to_numpy
from strategies.registry import build_strategy

DFL_DP_FAULTS = FAULTS_BY_STUDY["dfl-dp"]
C, N, EPS = 1.0, 4, 2.0


def _zero() -> OrderedDict:
    return OrderedDict(w=np.zeros((3, 3), dtype=np.float32))


def _handler(framework: str, step: float):
    """FL: client c returns w + step (c + 1) everywhere; chain: each hop adds step."""

    def handler(node: int, msg: Message) -> Message:
        received = to_numpy(msg.content["arrays"])
        cids = [int(c) for c in msg.content["config"]["client-ids"]]
        out = RecordDict()
        model = received
        for cid in cids:
            if framework == "fl":
                out[client_key(cid)] = from_numpy(OrderedDict((k, v + step * (cid + 1)) for k, v in received.items()))
            else:
                model = OrderedDict((k, v + step) for k, v in model.items())
        if framework != "fl":
            out[client_key(cids[-1])] = from_numpy(model)
        out["metrics"] = MetricRecord({"num-examples": 10 * len(cids), "train-loss": 1.0, "client-ids": cids})
        return Message(out, reply_to=msg)

    return handler


def _round(fake_grid_cls, framework: str, fault: str, step: float, canaries: CanarySet | None = None,
           eps_cal: float = EPS, seed_file: str = "") -> tuple[np.ndarray, MetricRecord, MatchedPerturbation]:
    grid = fake_grid_cls([1, 2], _handler(framework, step))
    s = build_strategy(framework, list(range(N)), "x", clients_per_message=2, dp=True, clip_norm=C, eps_cal=eps_cal,
                       noise=NoiseSource(seed_file) if seed_file else None, stream=(7,), canaries=canaries,
                       fault=fault)
    g = s.prepare_grid(grid)
    msgs = list(s.configure_train(1, from_numpy(_zero()), ConfigRecord({"run-config": "{}"}), g))
    arrays, metrics = s.aggregate_train(1, g.send_and_receive(msgs, timeout=5))
    return to_numpy(arrays)["w"].astype(np.float64).ravel(), metrics, s


@pytest.fixture
def seed_file(tmp_path) -> str:
    p = tmp_path / "noise.seed"
    p.write_text("issue 37 unit test")
    return str(p)


def test_a_fault_is_refused_without_the_environment_switch_and_unknown_ones_always(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(ValueError, match=ALLOW_ENV):
        MatchedPerturbation(EqualWeightFedAvg([0], "x"), C, EPS, 1e-5, "client", fault="noise-div-2")
    monkeypatch.setenv(ALLOW_ENV, "1")
    with pytest.raises(ValueError, match="fault must be"):
        MatchedPerturbation(EqualWeightFedAvg([0], "x"), C, EPS, 1e-5, "client", fault="dpsgd-noise-div-10")
    with pytest.raises(ValueError, match="needs dp=True"):
        build_strategy("fl", [0, 1], "x", fault="skip-clip")
    assert MatchedPerturbation(EqualWeightFedAvg([0], "x"), C, EPS, 1e-5, "client").fault == ""


@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
@pytest.mark.parametrize("fault", DFL_DP_FAULTS)
def test_each_fault_changes_what_it_should_and_nothing_else(fake_grid_cls, monkeypatch, seed_file, framework, fault):
    """Same seeded noise stream: the faulty release against the correct one, and what each reports."""
    monkeypatch.setenv(ALLOW_ENV, "1")
    step = 1.0  # every update has norm > C: the correct mechanism clips all of them
    ok, m_ok, s_ok = _round(fake_grid_cls, framework, "", step, seed_file=seed_file)
    bad, m_bad, s_bad = _round(fake_grid_cls, framework, fault, step, seed_file=seed_file)
    sigma = calibrate_sigma_abs(C, N, EPS)
    # The clean signal: FL, the mean of 4 updates clipped to C (each C / 3 per coordinate); DFL, the
    # round update 4 x ones(9) clipped to C once. Unclipped: FL mean 2.5 per coordinate, DFL 4.
    clean = np.full(9, C / 3)
    unclipped = np.full(9, 2.5 if framework == "fl" else 4.0)
    z = ok - clean  # the correct mechanism's noise draw
    assert z.std() > 0.1 * sigma
    # what the mechanism reports: the clip counters never change; sigma only under wrong-cohort
    for key in ("clip-count", "clip-total", "clip-fraction", "num-contributors"):
        assert m_bad[key] == m_ok[key], key
    assert s_bad.clip_summary() == s_ok.clip_summary()
    reported = calibrate_sigma_abs(C, N * WRONG_COHORT_FACTOR, EPS) if fault == "wrong-cohort" else sigma
    assert m_bad["sigma-abs"] == pytest.approx(reported) and m_ok["sigma-abs"] == pytest.approx(sigma)
    if fault.startswith("noise-div-"):
        np.testing.assert_allclose(bad, clean + z / float(fault.split("-")[-1]), atol=1e-6)
    elif fault == "wrong-cohort":
        np.testing.assert_allclose(bad, clean + z / WRONG_COHORT_FACTOR, atol=1e-6)
    elif fault == "skip-clip":
        np.testing.assert_allclose(bad, unclipped + z, atol=1e-5)
    else:  # clip-after-noise: the noised unclipped update, projected onto the C-ball
        noised = unclipped + z
        np.testing.assert_allclose(bad, noised * C / np.linalg.norm(noised), atol=1e-6)
        assert np.linalg.norm(bad) == pytest.approx(C, rel=1e-5)


def test_fl_canaries_pass_through_the_client_clip_and_a_skipped_clip_lets_them_in(fake_grid_cls, monkeypatch):
    """Two canaries at 5C (one inserted): clipped to C like a client; unclipped under skip-clip. Noise ~ 0."""
    monkeypatch.setenv(ALLOW_ENV, "1")
    vec = np.zeros((2, 9))
    vec[0, 0], vec[1, 1] = 5 * C, 5 * C
    canaries = CanarySet(vec, np.array([True, False]), C, np.array([-1, -1]), (2.0, 10.0))
    m = N + 1
    for fault, canary_norm in (("", C), ("skip-clip", 5 * C)):
        out, metrics, s = _round(fake_grid_cls, "fl", fault, 0.0, canaries=canaries, eps_cal=1e9)
        # real clients' updates are 0 (step 0): the release is the canary's (clipped) update over m members
        assert out[0] == pytest.approx(canary_norm / m, rel=1e-5) and np.abs(out[1:]).max() < 1e-6
        assert metrics["num-canaries"] == 1 and metrics["sigma-abs"] == pytest.approx(calibrate_sigma_abs(C, m, 1e9))
        # the canary's clip is recorded as a canary's, out of the real clients' counters
        assert metrics["canary-clip-count"] == 1 and metrics["clip-total"] == N and metrics["clip-count"] == 0
        assert [e["who"] for e in s.clip_events if e["who"].startswith("canary-")] == ["canary-0"]


# -- end to end: the smoke preset through Flower ----------------------------------------------------------

#: (fault, framework): every dfl-dp fault in FL; in sequential DFL too (skip-clip is caught there by the
#: release-norm test alone: the formal mu of one hop is too large for the separation test)
E2E = [(f, "fl") for f in ("", *DFL_DP_FAULTS)] + [(f, "sequential-dfl") for f in ("", *DFL_DP_FAULTS)]


@pytest.fixture(scope="module")
def trials() -> dict[tuple[str, str], dict]:
    from flower_apps.dfl_dp.audit_trial import audit_trials

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ALLOW_ENV, "1")
        results = audit_trials([(f, 0, fw) for f, fw in E2E])
    return {(a["trial"]["fault"], a["trial"]["framework"]): a for a in results}


@pytest.mark.slow
@pytest.mark.parametrize("fault,framework", [e for e in E2E if e[0]])
def test_each_fault_is_a_violation_at_the_smoke_preset(trials, fault, framework):
    audit = trials[(fault, framework)]
    assert audit["verdict"] == "violation", audit["verdict_detail"]
    assert audit["dp_fault"] == fault and f"_FAULT-{fault}" in audit["trial"]["run"]
    fired = set(audit["verdict_detail"]["fired"])
    expected = {"noise-div-2": "measured-noise", "noise-div-10": "measured-noise", "wrong-cohort": "reported-sigma",
                "skip-clip": "separation" if framework == "fl" else "release-norm",
                "clip-after-noise": "measured-noise"}[fault]
    assert expected in fired, fired


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["fl", "sequential-dfl"])
def test_the_correct_mechanism_is_consistent_with_power_at_the_smoke_preset(trials, framework):
    audit = trials[("", framework)]
    detail = audit["verdict_detail"]
    assert audit["verdict"] == "consistent", detail
    assert {"reported-sigma", "measured-noise", "release-norm"} <= set(detail["powered"])
    noise = next(t for t in detail["tests"] if t["test"] == "measured-noise")
    assert 0.7 < noise["measured_over_configured"] < 1.3
    ref = audit["configured"]
    k_in = audit["canaries"]["num_inserted"]
    assert audit["canaries"]["norm_range_over_c"] == [2.0, 10.0] and k_in == 50
    assert ref["sigma_abs"] == pytest.approx(calibrate_sigma_abs(1.0, 10 + k_in, 2.0))
    # the lower bound is kept, with its ceiling
    for tm in audit["threat_models"].values():
        assert 0 <= tm["eps_lower"] <= tm["max_certifiable_epsilon"] + 1e-12


@pytest.mark.slow
def test_the_audit_table_shows_each_runs_verdict(trials, tmp_path):
    from flower_apps.common.results import atomic_write_json
    from flower_apps.dfl_dp.audit_report import write_audit_table

    for (_fault, _framework), audit in trials.items():
        run = tmp_path / "dfl-dp" / "runs" / audit["trial"]["run"]
        atomic_write_json(run / "audit.json", audit)
        atomic_write_json(run / "summary.json", {"run": run.name, "clip_norm": 1.0, "eps_cal": 2.0, "num_clients": 10,
                                                 "num_rounds": 2, "seed": 0, "final_acc": 0.1})
    md = write_audit_table(tmp_path)
    assert "verdict" in md
    assert md.count("| consistent |") == 2 and md.count("| violation (") == len(E2E) - 2
