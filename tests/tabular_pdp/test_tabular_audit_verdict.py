"""Issue 37 for tabular-pdp: each broken GDP / PDP mechanism changes only what it should, and the audit calls it.

Unit part: the wrappers (strategies.server_fixed_clipping, strategies.personalized_clipping) with and
without each fault of privacy/faults.py, on the same noise stream, so a fault's effect is seen exactly.
End-to-end part: one simulation at the smoke preset through the real server path (flower_apps/tabular_pdp/
audit_trial.py: GDP and PDP, n_eps = 1, 40 canaries per client at 2C-10C), one run per fault and one
correct run, all at seed 1: every fault is a ``violation`` in each setting it breaks, the correct
mechanism ``consistent`` (both bug classes powered). The seed is fixed: a correct run is flagged in
at most the run's 5% family-wise rate of seeds (measured with audit_trial over 30 seeds).
"""

from __future__ import annotations

import math
import uuid
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flower_apps.tabular_pdp.strategy import CohortFedAvg
from privacy.audit import make_canaries
from privacy.faults import ALLOW_ENV, FAULTS_BY_STUDY, WRONG_COHORT_FACTOR
from privacy.personalized import personalized_sigmas
from strategies.canaries import WeightedCanaries
from strategies.layer import layers
from strategies.personalized_clipping import PersonalizedServerSideClipping
from strategies.server_fixed_clipping import ServerSideFixedClipping

P, C = 3000, 1.0
FAULTS = FAULTS_BY_STUDY["tabular-pdp"]
SENT: dict[str, Message] = {}


@pytest.fixture(autouse=True)
def _allow_faults(monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "1")


def _arrays(w: np.ndarray) -> ArrayRecord:
    return ArrayRecord(OrderedDict({"w": Array(w.astype(np.float32))}))


def _reply(cid: int, w: np.ndarray, n: int = 100) -> Message:
    out = Message(RecordDict({"config": ConfigRecord({"client-ids": [cid]})}), message_type="train.tabular_pdp",
                  dst_node_id=1)
    out.metadata.__dict__["_message_id"] = str(uuid.uuid4())
    SENT[out.metadata.message_id] = out
    return Message(RecordDict({"arrays": _arrays(w), "metrics": MetricRecord({"num-examples": n, "train-loss": 0.0}),
                               "info": ConfigRecord({"client-id": cid})}), reply_to=out)


def _round(wrapper, updates: dict[int, np.ndarray], current: np.ndarray) -> np.ndarray:
    """One aggregation of ``updates`` (client -> w_i - w) from ``current``; the released change (float64)."""
    replies = [_reply(c, current + u) for c, u in updates.items()]
    for layer in layers(wrapper):  # what configure_train does in a run: every layer remembers the round's messages
        layer._sent = [SENT[r.metadata.reply_to_message_id] for r in replies]
    wrapper.current_arrays = _arrays(current)
    arrays, _ = wrapper.aggregate_train(1, replies)
    return arrays["w"].numpy().astype(np.float64) - current.astype(np.float32)


def _canaries(seed: int = 3) -> WeightedCanaries:
    """Two canaries per client 0 and 1 (one inserted each), norms 2C-10C."""
    c = make_canaries(4, P, C, np.random.default_rng(seed), groups=np.array([0, 0, 1, 1]), norm_range=(2.0, 10.0))
    return WeightedCanaries(c, {0: 100, 1: 100}, {0: 0.1, 1: 0.3})


def _gdp(fault: str = "", z: float = 1.0, canaries: bool = True) -> ServerSideFixedClipping:
    return ServerSideFixedClipping(CohortFedAvg([0, 1], "tabular_pdp"), z, C, np.random.default_rng(7),
                                   _canaries() if canaries else None, fault=fault)


def _pdp(fault: str = "", z: float = 1.0, canaries: bool = True) -> PersonalizedServerSideClipping:
    return PersonalizedServerSideClipping(CohortFedAvg([0, 1], "tabular_pdp"), z, C, {0: 0.1, 1: 0.3},
                                          np.random.default_rng(7), _canaries() if canaries else None, fault=fault)


def _updates() -> dict[int, np.ndarray]:
    rng = np.random.default_rng(11)
    return {0: rng.normal(0, 5 / math.sqrt(P), P), 1: rng.normal(0, 0.2 / math.sqrt(P), P)}  # norms ~5 C and ~0.2 C


def test_faults_are_refused_without_the_environment_flag(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    for make in (_gdp, _pdp):
        with pytest.raises(ValueError, match=ALLOW_ENV):
            make("noise-div-10")
        with pytest.raises(ValueError, match="fault must be"):
            make("dpsgd-noise-div-10")
    assert _gdp().fault == "" and _pdp().fault == ""


def test_canaries_above_c_pass_through_the_same_clip_as_real_clients():
    """z = 0: the release is FedAvg over real clients and canaries; each canary enters clipped to C."""
    w = _canaries()
    vecs = w.updates().astype(np.float64)
    clipped = vecs * np.minimum(1, C / np.linalg.norm(vecs, axis=1))[:, None]
    assert np.all(np.linalg.norm(vecs, axis=1) >= 2 * C * (1 - 1e-5))
    zero = {0: np.zeros(P), 1: np.zeros(P)}
    for make in (_gdp, _pdp):
        got = _round(make(z=0.0), zero, np.zeros(P))
        np.testing.assert_allclose(got, clipped.sum(axis=0) * 100 / 400, atol=1e-6)
        unclipped = _round(make("skip-clip", z=0.0), zero, np.zeros(P))
        np.testing.assert_allclose(unclipped, vecs.sum(axis=0) * 100 / 400, atol=1e-5)


@pytest.mark.parametrize("fault", ["noise-div-2", "noise-div-10", "wrong-cohort"])
def test_gdp_noise_faults_shrink_only_the_noise(fault):
    cur, ups = np.zeros(P), _updates()
    signal_free = _round(_gdp(z=0.0), ups, cur)
    ok, bad = _gdp(), _gdp(fault)
    got_ok, got_bad = _round(ok, ups, cur), _round(bad, ups, cur)
    k = {"noise-div-2": 2, "noise-div-10": 10, "wrong-cohort": WRONG_COHORT_FACTOR}[fault]
    # the same noise stream: the faulty release carries exactly the correct one's noise / k
    np.testing.assert_allclose(got_bad - signal_free, (got_ok - signal_free) / k, atol=1e-6)
    reported = ok.rounds[1]["sigma"] / (k if fault == "wrong-cohort" else 1)  # wrong-cohort reports what it used
    assert bad.rounds[1]["sigma"] == pytest.approx(reported)
    for key in ("m", "clipped", "update_norms", "canary_signal_over_sigma"):
        if key != "canary_signal_over_sigma" or fault != "wrong-cohort":
            assert bad.rounds[1][key] == ok.rounds[1][key], key


def test_gdp_clip_faults_let_updates_in_unclipped_with_the_counters_unchanged():
    cur, ups = np.zeros(P), _updates()
    ok = _gdp(z=0.0)
    clean = _round(ok, ups, cur)
    skip = _gdp("skip-clip", z=0.0)
    raw = _round(skip, ups, cur)
    assert skip.rounds[1]["clipped"] == ok.rounds[1]["clipped"] == 1  # client 0 still counted as clipped
    assert np.linalg.norm(raw) > 2 * np.linalg.norm(clean)
    after, noisy_ok = _gdp("clip-after-noise"), _gdp()
    noised = _round(after, ups, cur)
    assert np.linalg.norm(noised) <= C * (1 + 1e-5)  # the noised round update is projected onto the C-ball
    assert np.linalg.norm(_round(noisy_ok, ups, cur)) > 2 * C  # the correct release's noise is not clipped
    assert after.rounds[1]["clipped"] == 1 and after.rounds[1]["sigma"] == noisy_ok.rounds[1]["sigma"]
    # the PDP-only fault changes nothing under GDP
    np.testing.assert_array_equal(_round(_gdp(), ups, cur), _round(_gdp("pdp-one-client-noise-div-10"), ups, cur))


class _Seen(CohortFedAvg):
    """FedAvg that keeps the members' noised replies it aggregates."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.seen = {int(r.content["info"]["client-id"]): r.content["arrays"]["w"].numpy().astype(np.float64)
                     for r in replies}
        return super().aggregate_train(server_round, replies)


def _pdp_members(fault: str = "", z: float = 1.0) -> tuple[PersonalizedServerSideClipping, dict[int, np.ndarray]]:
    base = _Seen([0, 1], "tabular_pdp")
    pdp = PersonalizedServerSideClipping(base, z, C, {0: 0.1, 1: 0.3}, np.random.default_rng(7), _canaries(),
                                         fault=fault)
    ups = _updates()
    _round(pdp, ups, np.zeros(P))
    return pdp, {c: base.seen[c] - ups[c] * min(1, C / np.linalg.norm(ups[c])) for c in base.seen}  # the noise


@pytest.mark.parametrize("fault,factor", [("noise-div-2", (2, 2)), ("noise-div-10", (10, 10)),
                                          ("pdp-one-client-noise-div-10", (10, 1)),
                                          ("wrong-cohort", (math.sqrt(WRONG_COHORT_FACTOR),) * 2)])
def test_pdp_noise_faults_shrink_the_right_members_noise(fault, factor):
    ok, noise_ok = _pdp_members()
    bad, noise_bad = _pdp_members(fault)
    for c, f in zip((0, 1), factor):  # same stream: each member's noise is the correct one's / f
        np.testing.assert_allclose(noise_bad[c], noise_ok[c] / f, rtol=1e-4, atol=1e-6)
    expected = dict(ok.rounds[1]["sigmas"])
    if fault == "wrong-cohort":  # the mechanism reports the sigmas it used: sized for 10x the cohort
        s = personalized_sigmas([0.1, 0.3, 0.1, 0.3] * WRONG_COHORT_FACTOR, 1.0, C)
        expected = {0: s[0], 1: s[1]}
        assert expected[0] == pytest.approx(ok.rounds[1]["sigmas"][0] / math.sqrt(WRONG_COHORT_FACTOR))
    assert bad.rounds[1]["sigmas"] == pytest.approx(expected)
    assert bad.rounds[1]["clipped"] == ok.rounds[1]["clipped"] == 1
    # the canaries' noise as the server holds it (along held-out directions orthogonal to the canary: pure
    # noise): client 0's canary gets client 0's noise, so under pdp-one-client only group 0's shrinks
    for g, f in zip((0, 1), factor):
        p_ok, p_bad = ok.canaries.noised_projections[g][0][1], bad.canaries.noised_projections[g][0][1]
        np.testing.assert_allclose(p_bad, p_ok / f, rtol=1e-6, atol=1e-9)


def test_the_noised_canaries_components_are_pure_noise_clipped_or_not():
    """z = 0: what the server holds of a canary is a multiple of it, so nothing is left along the directions."""
    for fault in ("", "skip-clip"):
        pdp, _ = _pdp_members(fault, z=0.0)
        for g in (0, 1):
            assert np.abs(pdp.canaries.noised_projections[g][0][1]).max() < 1e-9


def test_pdp_clip_faults():
    ups = _updates()
    skip, _ = _pdp_members("skip-clip", z=0.0)
    base = skip.strategy
    np.testing.assert_allclose(base.seen[0], ups[0].astype(np.float32), atol=1e-6)  # unclipped, norm ~5 C
    assert skip.rounds[1]["clipped"] == 1
    after, _ = _pdp_members("clip-after-noise")
    for c in (0, 1):  # noise first, then the clip: every noised update lies in the C-ball
        assert np.linalg.norm(after.strategy.seen[c]) <= C * (1 + 1e-5)
    ok, _ = _pdp_members()
    assert np.linalg.norm(ok.strategy.seen[1]) > 3 * C  # the correct mechanism's noise (sigma_1 sqrt(P)) is not clipped


def test_gdp_and_pdp_record_the_plan_the_audit_recomputes():
    """The audit's reference (flower_apps.tabular_pdp.audit_verdict) matches the correct mechanism's report."""
    from flower_apps.tabular_pdp.audit_verdict import configured_releases

    for setting, make in (("gdp", _gdp), ("pdp", _pdp)):
        w = make()
        _round(w, _updates(), np.zeros(P))
        plan = configured_releases(setting, 1.0, C, {1: [0, 1]}, {0: 100, 1: 100}, {0: 0.1, 1: 0.3}, w.canaries)[1]
        reported = w.rounds[1]["sigma" if setting == "gdp" else "sigma_release"]
        assert plan.sd == pytest.approx(reported, rel=1e-12)
        assert plan.share == {0: pytest.approx(0.25), 1: pytest.approx(0.25)}
        if setting == "pdp":
            assert plan.member_sd == pytest.approx(w.rounds[1]["sigmas"])


# --- end to end: one simulation, one run per fault (smoke preset, the real server path) ------------------------


@pytest.fixture(scope="module")
def trials():
    mp = pytest.MonkeyPatch()
    mp.setenv(ALLOW_ENV, "1")
    try:
        import torch

        from flower_apps.tabular_pdp.audit_trial import audit_trials

        torch.set_num_threads(1)
        runs = [("", 1)] + [(f, 1) for f in FAULTS]
        return dict(zip([f for f, _ in runs], audit_trials(runs)))
    finally:
        mp.undo()


#: the settings each fault breaks (privacy/faults.py; the PDP-only fault leaves GDP as it is)
BROKEN = {f: ("pdp",) if f == "pdp-one-client-noise-div-10" else ("gdp", "pdp") for f in FAULTS}


@pytest.mark.slow
def test_the_correct_mechanism_is_consistent_with_power(trials):
    audit = trials[""]
    assert audit["verdict"] == "consistent" and audit["dp_fault"] == ""
    for setting in ("gdp", "pdp"):
        res = audit[setting]
        assert res["verdict"] == "consistent"
        for g, c in res["clients"].items():
            v = c["verdict"]
            assert v["verdict"] == "consistent" and "measured-noise" in v["powered"], (setting, g)
            noise = next(t for t in v["tests"] if t["test"] == "measured-noise")
            assert 0.75 < noise["measured_over_configured"] < 1.3
        pooled = res["clients"]["all"]["verdict"]
        assert pooled["ceiling"] < pooled["eps_formal"]  # the lower bound alone could never fire here: said so
        assert not next(t for t in pooled["tests"] if t["test"] == "lower-bound")["powered"]


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_is_a_violation_in_the_settings_it_breaks(trials, fault):
    audit = trials[fault]
    assert audit["verdict"] == "violation" and audit["dp_fault"] == fault
    for setting in ("gdp", "pdp"):
        expected = "violation" if setting in BROKEN[fault] else "consistent"
        assert audit[setting]["verdict"] == expected, (fault, setting)
    if fault == "pdp-one-client-noise-div-10":  # only the canaries standing for client 0 see it
        fired = {g: c["verdict"]["fired"] for g, c in audit["pdp"]["clients"].items() if c["verdict"]["fired"]}
        assert fired["0"] == ["member-noise"] and set(fired) <= {"0", "all"}  # 'all': every member's noise pooled
        assert fired.get("all", ["member-noise"]) == ["member-noise"]
    if fault == "wrong-cohort":  # the reported sigma is not the configured one: the exact test says so
        assert "reported-sigma" in audit["gdp"]["clients"]["all"]["verdict"]["fired"]


@pytest.mark.slow
def test_the_audit_table_shows_each_verdict_and_the_fired_tests(trials, tmp_path):
    from flower_apps.common.results import atomic_write_json
    from flower_apps.tabular_pdp.audit_report import audit_rows, setting_results, write_audit_table

    for name, fault in (("ok", ""), ("bad", "pdp-one-client-noise-div-10")):
        audit = {k: v for k, v in trials[fault].items() if k != "trial"}
        run = tmp_path / "tabular-pdp" / "runs" / name
        atomic_write_json(run / "audit.json", audit)
        atomic_write_json(run / "summary.json", {"run": name, "regions": {}, "settings": {
            s: {"accounting": {}} for s in setting_results(audit)}})
    rows = audit_rows(tmp_path)
    verdict = {(r["run"], r["setting"], r["client"]): r["verdict"] for r in rows}
    assert verdict[("bad", "PDP", "0")] == "violation (member-noise)"
    assert verdict[("bad", "GDP", "0")] == verdict[("ok", "PDP", "all")] == "consistent"
    assert all(r["lower bound ceiling"] != "n/a" and r["noise measured / configured"] != "n/a" for r in rows)
    assert "| client | verdict |" in write_audit_table(tmp_path)


def test_the_signal_test_holds_the_clipped_signal_and_fires_on_unclipped_canaries():
    from flower_apps.tabular_pdp.audit_verdict import honest_noise_power, signal_test
    from privacy.audit.verdict import noise_test

    rng = np.random.default_rng(0)
    spread = 4.0  # the clients' updates along random directions: spread only, zero mean
    out = rng.normal(0, spread, 200)
    ok = signal_test(rng.normal(3.0, spread, 200), out, 3.0, 18.0, 0.001)
    bad = signal_test(3.0 * rng.uniform(2, 10, 200) + rng.normal(0, spread, 200), out, 3.0, 18.0, 0.001)
    assert not ok["fired"] and ok["powered"] and bad["fired"] and bad["signal_over_formal"] > 4
    # a noise test on projections dominated by signal energy e has no power against half the noise
    t = noise_test(rng.normal(0, 1, (2, 200)), [1.0, 1.0], 0.001)
    assert honest_noise_power(t, 0.0)["powered"] and not honest_noise_power(t, 2.0)["powered"]
