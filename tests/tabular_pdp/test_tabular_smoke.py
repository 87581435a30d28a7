"""End to end: the smoke preset through Flower's real simulation path (router ServerApp/ClientApp), then the report."""

import pytest

from flower_apps.common.results import read_json, read_jsonl


@pytest.mark.slow
def test_smoke_preset_through_flower_simulation_writes_every_result(tmp_path):
    import torch

    from flower_apps.runner import run_config_in_process
    from flower_apps.tabular_pdp.report import write_report

    torch.set_num_threads(1)
    run_config_in_process({"study": "tabular-pdp", "preset": "smoke", "results-dir": str(tmp_path)})
    (run,) = (tmp_path / "tabular-pdp" / "runs").iterdir()
    s = read_json(run / "summary.json")
    # anonymization (two message rounds): the paper's levels, ARIREC and t in the paper's neighbourhood
    assert s["levels"] == [2, 1, 0, 0] and s["levels_source"].startswith("element-wise maximum of 10")
    assert s["model_inputs"] == ["Age", "Year", "Genetic_Risk", "Air_Pollution", "Alcohol_Use", "Smoking",
                                 "Obesity_Level", "Cancer_Type", "Cancer_Stage"]
    anon = s["anonymization"].values()
    assert len(anon) == 10 and all(h["k"] >= 5 and 0.11 < h["arirec"] < 0.125 and 0.1 < h["t"] < 0.4 for h in anon)
    assert all(0 < h["suppressed"] <= 0.1 * h["n_original"] for h in anon)
    # drift check on clean clients: nobody flagged, everybody trains
    assert s["drift"]["flagged"] == [] and s["participants"] == list(range(10))
    assert (run / "drift_heatmap.png").stat().st_size > 1000
    # clip norm estimated from the update norms (90th percentile)
    norms = sorted(s["update_norms_estimation"].values())
    assert norms[0] <= s["clip_norm"] == s["clip_norm_estimate"] <= norms[-1]
    # the three settings: training works (a constant predictor has MAE ~0.96), DP costs accuracy
    v, g, p = (s["settings"][k] for k in ("vanilla", "gdp", "pdp"))
    assert v["final_mae"] < 0.7 and v["final_mre"] < 0.16
    assert g["final_mae"] > v["final_mae"] and p["final_mae"] > v["final_mae"]
    assert g["sigma_release"] == pytest.approx(0.05 * s["clip_norm"] / 10)
    assert p["sigma_release_over_gdp"] == pytest.approx(1.0, abs=0.01)
    for dp in (g, p):
        assert len(dp["accounting"]) == 10 and 0 < dp["eps_rdp_min"] <= dp["eps_rdp_max"] < float("inf")
    rounds = read_jsonl(run / "rounds.jsonl")
    assert [(r["setting"], r["round"]) for r in rounds] == [(k, t) for k in ("vanilla", "gdp", "pdp") for t in (1, 2)]
    assert all(r["contributors"] == list(range(10)) for r in rounds)
    for f in ("anonymization.md", "anonymization.csv", "table3.md", "drift.json", "config.json"):
        assert (run / f).is_file(), f
    md = write_report(tmp_path)
    assert "Table III" in md and "FL + PDP (ARIREC)" in md and "0.836 +- 0.270" in md
    out = tmp_path / "tabular-pdp"
    for f in ("table2_anonymization.md", "table2_vs_paper.md", "table3_comparison.csv", "drift_detection.md",
              "figure1_divergence_clean.png", "report.md"):
        assert (out / f).is_file(), f
