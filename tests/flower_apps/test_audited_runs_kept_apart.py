"""Audited runs (canary clients in the cohort, docs/audit.md) never enter the plain runs' utility tables.

Synthetic results trees, no training: a plain and an audited run of the same condition and seed
sit side by side with very different accuracies, so any mixing shows in the numbers.
"""

from __future__ import annotations

from flower_apps.common.results import atomic_write_json
from flower_apps.dfl_dp import report as dfl_report
from flower_apps.tabular_pdp import report as tab_report


def _dfl_summary(seed: int, acc: float, audited: bool) -> dict:
    s = {"framework": "fl", "dp": True, "data_part": "target", "seed": seed, "num_clients": 10, "num_rounds": 2,
         "dataset": "mnist-5k", "data_notes": [], "final_acc": acc, "best_acc": acc, "rounds_to_75": None,
         "stability_round": None, "acc_curve": [0.1, acc], "clip_norm": 1.0, "eps_cal": 2.0,
         "clip_frequency_pct": 100.0, "clip_unit": "client updates",
         "accounting": {"eps_total": 5.24, "eps_gdp_exact": 5.0}}
    if audited:
        s["audit"] = {"eps_formal_add_remove": 2.37, "threat_models": {}}
    return s


def test_dfl_dp_audited_runs_get_their_own_table(tmp_path):
    runs = tmp_path / "dfl-dp" / "runs"
    for seed, acc in ((0, 0.80), (1, 0.82)):
        atomic_write_json(runs / f"fl_C1_eps2_s{seed}" / "summary.json", _dfl_summary(seed, acc, False))
    atomic_write_json(runs / "fl_C1_eps2_s0_audit200" / "summary.json", _dfl_summary(0, 0.10, True))

    plain = dfl_report.load_summaries(tmp_path)
    audited = dfl_report.load_summaries(tmp_path, audited=True)
    assert sorted(s["final_acc"] for s in plain) == [0.80, 0.82] and [s["final_acc"] for s in audited] == [0.10]

    md = dfl_report.write_report(tmp_path)
    (row,) = dfl_report.build_rows(plain)[0]
    assert row["seeds"] == 2 and row["final acc (%)"].startswith("81.00")  # mean of 80 and 82 only
    plain_md = (tmp_path / "dfl-dp" / "table3_utility.md").read_text()
    audited_md = (tmp_path / "dfl-dp" / "table3_utility_audited.md").read_text()
    assert "81.00" in plain_md and "10.00" not in plain_md
    assert "10.00" in audited_md and "81.00" not in audited_md
    assert "audited runs" in md


def test_dfl_dp_report_of_an_audit_only_folder_writes_only_the_audited_table(tmp_path):
    atomic_write_json(tmp_path / "dfl-dp" / "runs" / "fl_a" / "summary.json", _dfl_summary(0, 0.10, True))
    dfl_report.write_report(tmp_path)
    assert (tmp_path / "dfl-dp" / "table3_utility_audited.md").is_file()
    assert not (tmp_path / "dfl-dp" / "table3_utility.md").exists()


def _tab_summary(seed: int, mae: float, audited: bool) -> dict:
    setting = {"final_mae": mae, "final_mre": mae / 10, "eps_rdp_min": 6.8, "eps_rdp_max": 7.3, "delta": 1e-5,
               "accounting": {"0": {"eps_rdp": 7.0}}}
    if audited:
        setting["audit"] = {"per_client": []}
    return {"run": f"r{seed}{'a' if audited else ''}", "seed": seed, "poison": "none", "local_epochs": 2,
            "num_rounds": 2, "dataset": "cancer-synthetic", "clip_norm": 1.8, "settings": {"gdp": setting}}


def test_tabular_pdp_audited_runs_stay_out_of_table_iii(tmp_path):
    runs = tmp_path / "tabular-pdp" / "runs"
    for seed, mae in ((0, 1.0), (1, 3.0)):
        atomic_write_json(runs / f"smoke_s{seed}" / "summary.json", _tab_summary(seed, mae, False))
    atomic_write_json(runs / "smoke_s0_audit40" / "summary.json", _tab_summary(0, 50.0, True))

    plain = tab_report.load_summaries(tmp_path)
    audited = tab_report.load_summaries(tmp_path, audited=True)
    assert [s["run"] for s in plain] == ["r0", "r1"] and [s["run"] for s in audited] == ["r0a"]
    (row,) = tab_report.table3_rows(plain)
    assert row["seeds"] == 2 and row["MAE"].startswith("2.000")  # mean of 1 and 3: the audited 50 is not in it
    (arow,) = tab_report.table3_rows(audited)
    assert arow["seeds"] == 1 and arow["MAE"].startswith("50.000")


def test_tabular_pdp_report_of_an_audit_only_folder_writes_only_the_audited_table(tmp_path):
    atomic_write_json(tmp_path / "tabular-pdp" / "runs" / "a" / "summary.json", _tab_summary(0, 50.0, True))
    md = tab_report.write_report(tmp_path)
    assert "Table III for the audited runs" in md and "50.000" in md
    assert (tmp_path / "tabular-pdp" / "table3_comparison_audited.md").is_file()
    assert not (tmp_path / "tabular-pdp" / "table3_comparison.md").exists()
