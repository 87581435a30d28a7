"""dfl-dp's client sampling (client-fraction, client-sampling): the keys, q = 1 as before, runs through Flower."""

import dataclasses

import numpy as np
import pytest

from flower_apps.common.results import read_json, read_jsonl, run_hash
from flower_apps.config import ConfigError, noise_condition
from flower_apps.router import prepare

SMOKE = {"study": "dfl-dp", "preset": "smoke"}


def cfg_of(**keys):
    return prepare({**SMOKE, **{k.replace("_", "-"): v for k, v in keys.items()}})[1]


@pytest.mark.parametrize("keys,named", [
    ({"client-fraction": 0.0}, "client-fraction"),
    ({"client-fraction": -0.5}, "client-fraction"),
    ({"client-fraction": 1.5}, "client-fraction"),
    ({"client-fraction": 0.5, "client-sampling": "bernoulli"}, "client-sampling"),
    ({"client-sampling": "fixed"}, "client-sampling"),  # q = 1 does not read the scheme: refused, not ignored
    ({"client-fraction": 0.01, "client-sampling": "fixed"}, "client-fraction"),  # round(0.01 x 10) = 0 clients
    ({"client-fraction": 0.5, "capture-victims": 2}, "capture-victims"),
])
def test_bad_sampling_settings_are_refused_naming_the_key_before_any_work(keys, named):
    with pytest.raises(ConfigError, match=named):
        prepare({**SMOKE, **keys})


def test_fixed_size_sampling_with_the_audit_is_refused_naming_both_keys():
    with pytest.raises(ConfigError) as err:
        prepare({**SMOKE, "client-fraction": 0.5, "client-sampling": "fixed", "audit-canaries": 4})
    assert "client-sampling" in str(err.value) and "audit-canaries" in str(err.value)
    prepare({**SMOKE, "client-fraction": 0.5, "client-sampling": "poisson", "audit-canaries": 4})  # Poisson: audited


def test_full_participation_is_the_config_it_was_before_the_keys():
    """client-fraction = 1 (given or not): the same run identity, run name and seeded-noise condition as a
    config written before the keys existed, and no sampler (today's code path)."""
    from flower_apps.dfl_dp.server_app import cohort_sampler
    from privacy.randomness import NoiseSource

    base = cfg_of()
    given = cfg_of(client_fraction=1.0, client_sampling="poisson")
    assert run_hash(given) == run_hash(base) and given.default_run_name == base.default_run_name
    assert noise_condition(given) == noise_condition(base)
    assert "client_fraction" not in type(base).key_table.identity(base)
    assert cohort_sampler(given, NoiseSource(), 0) is None
    sampled = cfg_of(client_fraction=0.5)
    assert run_hash(sampled) != run_hash(base) and "_q0.5-poisson_" in sampled.default_run_name
    assert run_hash(dataclasses.replace(sampled, client_sampling="fixed")) != run_hash(sampled)


@pytest.mark.slow
def test_a_sampled_run_through_flower_is_deterministic_with_the_servers_seed_file_and_reports_amplification(tmp_path):
    """q = 0.4 (Poisson) on the smoke preset, twice with the same local seed file: the same cohorts and model."""
    import torch

    from flower_apps.dfl_dp.card import collect_dfl_dp
    from flower_apps.dfl_dp.server_app import server_main
    from flower_apps.runner import run_many_in_process
    from privacy.accounting import account_sampled
    from privacy.mechanisms import calibrate_sigma_abs

    secret = tmp_path / "noise.seed"
    secret.write_text("the server's secret")
    configs = [prepare({**SMOKE, "num-rounds": 3, "client-fraction": 0.4, "results-dir": str(tmp_path),
                        "run-name": name, "noise-seed-file": str(secret)})[1] for name in ("a", "b")]
    run_many_in_process(configs, server_main, num_supernodes=2)
    runs = tmp_path / "dfl-dp" / "runs"
    rounds = {n: read_jsonl(runs / n / "rounds.jsonl") for n in ("a", "b")}
    assert [r["num_sampled"] for r in rounds["a"]] == [r["num_sampled"] for r in rounds["b"]]
    state = {n: torch.load(runs / n / "final_model.pt", weights_only=True) for n in ("a", "b")}
    assert all(torch.equal(state["a"][k], state["b"][k]) for k in state["a"])

    s = read_json(runs / "a" / "summary.json")
    assert s["client_sampling"] == "poisson" and s["client_fraction"] == 0.4 and s["sampling_cohort"] == 4.0
    assert all(r["num_contributors"] == r["num_sampled"] <= 10 for r in rounds["a"])
    assert len(rounds["a"]) == 3  # every Poisson round releases, an empty draw included
    sigma = calibrate_sigma_abs(1.0, 4.0, 2.0)  # sized for the fixed expected cohort q N, whatever the draw
    assert all(r["sigma_abs"] == pytest.approx(sigma) for r in rounds["a"]) and s["sigma_abs_nominal"] == sigma
    led = s["accounting_sampled"]
    ref = account_sampled("fl", 1.0, 2.0, 10, 3, 1e-5, 1e-5, 0.4, "poisson")
    assert led["eps_total"] == ref.eps_total < led["eps_unamplified"] and led["neighbouring"] == "add-remove"
    assert s["accounting"]["num_clients"] == 10  # the full-participation ledger beside it (the paper's setting)
    # the report card shows the sampled ledger's epsilon, in a condition of its own
    (rec_a, rec_b) = sorted(collect_dfl_dp(tmp_path / "dfl-dp"), key=lambda r: r["condition"])
    assert rec_a["eps"] == led["eps_total"] and "q=0.4 (poisson sampling)" in rec_a["condition"]


@pytest.mark.slow
def test_an_audited_poisson_run_compares_with_the_sampled_epsilon_and_still_catches_broken_noise(monkeypatch):
    """Canaries are drawn like clients; the audit's formal epsilons are the amplified ones, the correct mechanism
    is not called a violation, and two broken ones (noise / 2, noise sized for a larger cohort) are."""
    from flower_apps.dfl_dp.audit_trial import audit_trials
    from privacy.accounting import account_sampled, poisson_sampled_epsilon
    from privacy.faults import ALLOW_ENV

    monkeypatch.setenv(ALLOW_ENV, "1")
    trials = audit_trials([("", 0), ("noise-div-2", 0), ("wrong-cohort", 0)], num_rounds=3,
                          **{"client-fraction": 0.5, "audit-canaries": 40})
    a = trials[0]
    assert a["released_rounds"] == 3 and a["sampling"]["client_fraction"] == 0.5
    assert a["sampling"]["cohort"] == pytest.approx(0.5 * (10 + 20))  # the draw's population: N + K_in canaries
    study = account_sampled("fl", 1.0, 2.0, 30, 3, 1e-5, 1e-5, 0.5, "poisson")
    assert a["eps_formal_study"] == study.eps_total
    ref = a["configured"]
    assert ref["eps_formal"] == pytest.approx(poisson_sampled_epsilon(0.5, [ref["sigma_abs"] / ref["canary_signal"]] * 3,
                                                                      1e-5))
    assert ref["eps_formal"] < ref["eps_formal_unamplified"]
    assert a["eps_formal_add_remove"] == pytest.approx(ref["eps_formal"])  # reported sigmas = configured ones
    assert a["verdict"] == "consistent", a["verdict_detail"]
    assert np.isfinite(a["threat_models"]["all-iterates"]["eps_lower"])
    for broken, fires in ((trials[1], "measured-noise"), (trials[2], "reported-sigma")):
        assert broken["verdict"] == "violation" and fires in broken["verdict_detail"]["fired"], broken["verdict_detail"]
