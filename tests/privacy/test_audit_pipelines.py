"""--audit end to end: dfl-dp (FL, sequential DFL) and tabular-pdp (GDP, PDP) at smoke scale through Flower."""

import math

import pytest

from flower_apps.common.results import read_json, read_jsonl, run_hash
from flower_apps.config import ConfigError
from privacy.mechanisms import calibrate_sigma_abs


def test_audit_keys_are_checked_and_kept_apart_from_plain_runs():
    from flower_apps.router import prepare
    from flower_apps.tabular_pdp.config import config_for

    base = {"study": "dfl-dp", "preset": "smoke"}
    with pytest.raises(ConfigError, match="audit-canaries: an audit measures a DP mechanism"):
        prepare({**base, "dp": False, "audit-canaries": 8})
    with pytest.raises(ConfigError, match="audit-canaries: must be 0 or an even number"):
        prepare({**base, "audit-canaries": 7})
    plain, audited = prepare(base)[1], prepare({**base, "audit-canaries": 8})[1]
    assert audited.default_run_name == plain.default_run_name + "_audit8"
    assert run_hash(audited) != run_hash(plain)
    with pytest.raises(ConfigError, match="tab-audit-canaries: an audit measures GDP or PDP"):
        config_for("smoke", **{"tab-settings": "vanilla", "tab-audit-canaries": 4})
    assert config_for("smoke", **{"tab-audit-canaries": 4}).default_run_name.endswith("_audit4")


@pytest.mark.slow
def test_dfl_dp_audit_writes_its_numbers_and_sizes_noise_by_the_cohort(tmp_path):
    from flower_apps.dfl_dp.audit_report import write_audit_table
    from flower_apps.dfl_dp.server_app import server_main
    from flower_apps.router import prepare
    from flower_apps.runner import run_many_in_process

    configs = [prepare({"study": "dfl-dp", "preset": "smoke", "framework": fw, "num-rounds": 1, "audit-canaries": 8,
                        "results-dir": str(tmp_path)})[1] for fw in ("fl", "sequential-dfl")]
    run_many_in_process(configs, server_main, num_supernodes=2)
    for cfg in configs:
        run = tmp_path / "dfl-dp" / "runs" / cfg.default_run_name
        audit = read_json(run / "audit.json")
        assert audit["canaries"]["num_inserted"] == 4 and audit["released_rounds"] == 1
        for tm in ("all-iterates", "final-model"):
            assert audit["threat_models"][tm]["eps_lower"] >= 0 and audit["threat_models"][tm]["eps_point"] >= 0
        assert 0 < audit["eps_formal_add_remove"] < math.inf
        (row,) = read_jsonl(run / "rounds.jsonl")
        # The 4 inserted canaries are cohort members: sigma_abs sized for N + 4.
        assert row["num_canaries"] == 4
        assert row["sigma_abs"] == pytest.approx(calibrate_sigma_abs(1.0, 14, 2.0))
        assert read_json(run / "summary.json")["audit"]["all-iterates"]["eps_point"] >= 0
    md = write_audit_table(tmp_path)
    assert md.count("_audit8 |") == 2 and (tmp_path / "dfl-dp" / "audit_formal_vs_empirical.csv").is_file()


@pytest.mark.slow
def test_tabular_pdp_audit_reports_every_client_for_gdp_and_pdp(tmp_path):
    from flower_apps.runner import run_many_in_process
    from flower_apps.tabular_pdp.audit_report import audit_rows
    from flower_apps.tabular_pdp.config import config_for
    from flower_apps.tabular_pdp.server_app import run_dir, server_main

    cfg = config_for("smoke", **{"tab-settings": "gdp,pdp", "num-rounds": 1, "tab-audit-canaries": 4,
                                 "results-dir": str(tmp_path)})
    run_many_in_process([cfg], server_main, num_supernodes=cfg.num_clients)
    summary = read_json(run_dir(cfg) / "summary.json")
    audit = read_json(run_dir(cfg) / "audit.json")
    participants = {str(c) for c in summary["participants"]}
    for setting in ("gdp", "pdp"):
        res = audit[setting]
        assert set(res["clients"]) == participants | {"all"}  # "all": every client's canaries pooled
        assert res["canaries"]["num_canaries"] == 4 * len(participants)
        for c in res["clients"].values():
            assert 0 < c["eps_formal_add_remove"] < math.inf
            assert c["final-model"]["eps_lower"] >= 0
    assert len(audit_rows(tmp_path)) == 2 * (len(participants) + 1)
