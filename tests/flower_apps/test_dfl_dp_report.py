"""dfl-dp report: outputs named as the paper numbers them, rebuilt report-only from a synthetic results tree.

No training: the tree holds summary.json files and persisted attack results as the sweep writes
them, with numbers chosen so every aggregate can be checked by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from flower_apps.common.results import atomic_write_json
from flower_apps.dfl_dp import attack_report, report

FRAMEWORKS = ("fl", "sequential-dfl")
EPS = (1.0, 2.0, 4.0)
SEEDS = (0, 1, 2)


def _final_acc(fw: str, eps: float | None, seed: int) -> float:
    """Accuracy of the synthetic runs: No-DP 0.80 (FL) / 0.90 (DFL), each eps loses (4 - eps) pp; seed adds 1 pp."""
    base = 0.80 if fw == "fl" else 0.90
    drop = 0.0 if eps is None else (4.0 - eps) / 100
    return base - drop + seed / 100


def _summary(fw: str, seed: int, eps: float | None, clip_norm: float = 1.0) -> dict:
    acc = _final_acc(fw, eps, seed)
    s = {"framework": fw, "dp": eps is not None, "data_part": "target", "seed": seed, "num_clients": 100,
         "num_rounds": 3, "dataset": "fashion-mnist", "data_notes": [], "final_acc": acc, "best_acc": acc,
         "rounds_to_75": 2 if acc >= 0.75 else None, "stability_round": None, "acc_curve": [0.5, 0.7, acc],
         "clip_norm": clip_norm if eps is not None else None, "eps_cal": eps}
    if eps is not None:
        s.update(clip_frequency_pct=80.0 + 10.0 * seed,  # 80, 90, 100 over seeds
                 clip_unit="client updates" if fw == "fl" else "rounds",
                 accounting={"eps_total": 10.0 * eps, "eps_gdp_exact": 5.0 * eps})
    return s


def _write_tree(root, with_attacks: bool = True) -> None:
    runs = root / "dfl-dp" / "runs"
    for fw in FRAMEWORKS:
        for seed in SEEDS:
            conds = [(None, "nodp")] + [(e, f"C1_eps{e:g}") for e in EPS]
            for eps, cond in conds:
                d = runs / f"{fw}_{cond}_N100_T3_fashion-mnist_s{seed}"
                atomic_write_json(d / "summary.json", _summary(fw, seed, eps))
                if with_attacks:
                    atomic_write_json(d / "attacks_mia.json", [
                        {"framework": fw, "condition": cond, "seed": seed, "feature": "loss", "classifier": "logreg",
                         "auc": 0.5 + seed / 100, "tpr_at_fpr_0.001": 0.001, "tpr_at_fpr_0.01": 0.01}])
                    rows = []
                    for client in (3, 7):  # two victims: SSIM 0.1*seed + 0.0 / + 0.2 -> per-seed mean 0.1*seed + 0.1
                        for attack in ("dlg", "idlg", "invgrad"):
                            ssim = 0.1 * seed + (0.2 if client == 7 else 0.0) + (0.0 if eps is None else -eps / 100)
                            rows.append({"framework": fw, "condition": cond, "seed": seed, "client": client,
                                         "index": client, "attack": attack, "view": "gradient", "mse": 1.0 - ssim,
                                         "psnr": 10.0 + ssim, "ssim": ssim, "label_correct": 1.0,
                                         "reconstruction": torch.zeros(1, 8, 8).tolist()})
                    atomic_write_json(d / "attacks_inversion_gradient.json",
                                      {"iterations": 3, "restarts": 1, "rows": rows})
    # a shadow run never enters the utility tables
    atomic_write_json(runs / "fl_nodp_N100_T3_fashion-mnist_s0_shadow" / "summary.json",
                      {**_summary("fl", 0, None), "data_part": "shadow", "final_acc": 0.0})


def _fake_lookup(row):
    return torch.zeros(1, 8, 8), (0.5,), (0.5,)


def test_report_writes_every_output_under_the_papers_number_and_removes_retired_names(tmp_path):
    _write_tree(tmp_path)
    out = tmp_path / "dfl-dp"
    for old in ("table4_retention.md", "table4_retention.csv", "figure6_accuracy_curves.png", "figure7_mia_auc.png"):
        (out / old).write_text("stale")
    report.write_report(tmp_path)
    attack_report.write_attack_report(tmp_path, _fake_lookup)
    for stem in [*report.OUTPUTS, *attack_report.OUTPUTS]:
        if stem.startswith("runs/"):
            continue  # per-run class counts are written by the ServerApp, not the report
        files = [out / stem] if stem.endswith(".png") else [out / f"{stem}.csv", out / f"{stem}.md"]
        for f in files:
            assert f.is_file() and f.stat().st_size > 100, f
    for old in ("table4_retention.md", "table4_retention.csv", "figure6_accuracy_curves.png", "figure7_mia_auc.png"):
        assert not (out / old).exists(), old
    assert "Table 4: clipping frequency" in (out / "table4_clipping_frequency.md").read_text()
    assert "Table 6" in (out / "table6_gradient_inversion.md").read_text()


def test_table4_is_clipping_frequency_with_a_95_percent_t_interval(tmp_path):
    _write_tree(tmp_path, with_attacks=False)
    _, t4, rd = report.build_rows(report.load_summaries(tmp_path))
    assert [(r["framework"], r["condition"]) for r in t4] == [
        ("FL", f"C=1, eps_cal={e:g}") for e in EPS] + [("Sequential DFL", f"C=1, eps_cal={e:g}") for e in EPS]
    half = stats.t.ppf(0.975, 2) * 10.0 / math.sqrt(3)  # values 80, 90, 100: mean 90, SD 10
    assert t4[0]["clipping frequency (%)"] == f"90.0 +- 10.0 [{90 - half:.1f}, {90 + half:.1f}]"
    assert t4[0]["clipped"] == "client updates" and t4[-1]["clipped"] == "rounds"
    # retention stays a table of its own (the paper draws it as Figures 4-5): eps 1 loses 3 pp
    fl_eps1 = next(r for r in rd if r["framework"] == "FL" and r["condition"] == "C=1, eps_cal=1")
    assert fl_eps1["_deg"].mean == pytest.approx(3.0)


def test_figure6b_numbers_are_final_accuracy_per_eps_cal_at_c1(tmp_path):
    _write_tree(tmp_path, with_attacks=False)
    summaries = report.load_summaries(tmp_path)
    # a C = 0.1 run must not enter Figure 6b
    summaries.append(_summary("fl", 0, 2.0, clip_norm=0.1) | {"final_acc": 0.0})
    pts = report.accuracy_vs_eps(summaries, 1.0)
    assert set(pts) == set(FRAMEWORKS)
    for fw in FRAMEWORKS:
        assert pts[fw]["eps"] == list(EPS)
        base = 80.0 if fw == "fl" else 90.0
        for e, st in zip(EPS, pts[fw]["acc"]):
            assert st.n == 3 and st.mean == pytest.approx(base - (4 - e) + 1.0)  # seeds add 0, 1, 2 pp
        assert pts[fw]["nodp"].mean == pytest.approx(base + 1.0)
    assert report._accuracy_vs_eps_figure(summaries, 1.0, tmp_path / "f.png")
    assert not report._accuracy_vs_eps_figure(summaries, 0.5, tmp_path / "g.png")  # no run at C = 0.5
    assert not (tmp_path / "g.png").exists()


def test_figure7_numbers_average_victims_within_a_seed_then_over_seeds(tmp_path):
    _write_tree(tmp_path)
    _, inversion = attack_report.load_attack_rows(tmp_path)
    pts = attack_report.inversion_vs_eps(inversion["gradient"], "ssim")
    for fw in FRAMEWORKS:
        assert pts[fw]["eps"] == list(EPS)
        # per seed: mean of 0.1*seed and 0.1*seed + 0.2, minus eps/100; over seeds 0-2: 0.2 - eps/100
        for e, st in zip(EPS, pts[fw]["stat"]):
            assert st.n == 3 and st.mean == pytest.approx(0.2 - e / 100)
            assert st.sd == pytest.approx(0.1)  # seed means 0.1, 0.2, 0.3 (shifted): SD 0.1, not the victims' spread
        assert pts[fw]["nodp"].mean == pytest.approx(0.2)
    psnr = attack_report.inversion_vs_eps(inversion["gradient"], "psnr")
    assert psnr["fl"]["stat"][0].mean == pytest.approx(10.0 + 0.2 - 0.01)
    assert attack_report.inversion_vs_eps(inversion["gradient"], "ssim", attack="nope") == {}


def test_attack_report_is_empty_without_persisted_attack_results(tmp_path):
    _write_tree(tmp_path, with_attacks=False)
    assert attack_report.write_attack_report(tmp_path, _fake_lookup) == ""
    assert not (tmp_path / "dfl-dp" / "figure7_inversion_vs_eps_cal.png").exists()


def test_sweep_report_only_rebuilds_utility_and_attack_outputs_from_finished_runs(tmp_path, capsys, monkeypatch):
    from flower_apps.dfl_dp import sweep

    _write_tree(tmp_path)
    monkeypatch.setattr(attack_report, "_lookup_from_run_folder", _fake_lookup)  # no dataset needed
    assert sweep.main(["--grid", "smoke", "--report-only", "--results-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "Table 3" in printed and "Table 4: clipping frequency" in printed and "Table 5" in printed
    out = tmp_path / "dfl-dp"
    for f in ("figure6b_accuracy_vs_eps_cal.png", "figure7_inversion_vs_eps_cal.png", "mia_auc.png",
              "figure8_reconstructions.png"):
        assert (out / f).is_file(), f


@pytest.mark.parametrize("grid, rounds", [("protocol-fashion", 100), ("appendix-a", 200)])
def test_protocol_grids_match_issue_17(tmp_path, grid, rounds):
    from flower_apps.dfl_dp import sweep

    cfgs = sweep.build_configs(sweep.parse_args(["--grid", grid, "--results-dir", str(tmp_path)]))
    assert len(cfgs) == 2 * 4 * 3  # frameworks x (No-DP + C=1 x eps_cal {1, 2, 4}) x seeds
    assert {c.framework for c in cfgs} == set(FRAMEWORKS) and {c.seed for c in cfgs} == set(SEEDS)
    assert {c.condition for c in cfgs} == {"nodp", "C1_eps1", "C1_eps2", "C1_eps4"}
    assert {(c.num_clients, c.num_rounds, c.dataset, c.data_fraction) for c in cfgs} == {
        (100, rounds, "fashion-mnist", 1.0)}
    again = sweep.build_configs(sweep.parse_args(["--grid", grid, "--rounds", "7", "--results-dir", str(tmp_path)]))
    assert {c.num_rounds for c in again} == {7}  # --rounds still wins over the grid's T
