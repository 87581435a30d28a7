"""The privacy report card: a synthetic results tree of all four studies, and one real smoke run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flower_apps.common.report_card import AUDITED, NOT_RUN, audited_epsilon, build_card, is_audited_run, write_card
from flower_apps.report import main, write_page
from flower_apps.studies import STUDIES
from flower_apps.tabular_pdp.card import collect_tabular_pdp
from flower_apps.ultrasound.card import collect_ultrasound
from flower_apps.unlinkable_dfl.card import collect_unlinkable_dfl

CARD = {name: spec.card for name, spec in STUDIES.items()}


def _put(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _tree(root: Path) -> None:
    for seed, acc in ((0, 0.90), (1, 0.92)):
        nodp = root / "dfl-dp" / "runs" / f"fl_nodp_s{seed}"
        _put(nodp / "summary.json", {"framework": "fl", "dp": False, "seed": seed, "final_acc": acc})
        _put(nodp / "attacks_mia.json", [{"feature": "loss", "classifier": "threshold", "auc": 0.60 + seed / 100,
                                          "tpr_at_fpr_0.001": 0.01, "tpr_at_fpr_0.01": 0.02}])
        _put(nodp / "attacks_lira.json", {"settings": {}, "row": {"attack": "lira-offline", "auc": 0.70,
                                                                  "tpr_at_fpr_0.001": 0.05, "tpr_at_fpr_0.01": 0.1}})
        _put(nodp / "attacks_inversion_gradient.json", {"rows": [{"attack": "invgrad", "ssim": 0.8},
                                                                 {"attack": "dlg", "ssim": 0.2}]})
        dp = root / "dfl-dp" / "runs" / f"fl_C1_eps2_s{seed}"
        _put(dp / "summary.json", {"framework": "fl", "dp": True, "clip_norm": 1.0, "eps_cal": 2.0, "seed": seed,
                                   "final_acc": acc - 0.1, "accounting": {"eps_total": 6.3, "delta_total": 1e-5}})
        _put(dp / "audit.json", {"threat_models": {"final": {"eps_lower": 0.4}, "update": {"eps_lower": 1.1}}})
        # a shadow run serves the MIA only: never a card row
        _put(root / "dfl-dp" / "runs" / f"fl_nodp_s{seed}_shadow" / "summary.json",
             {"framework": "fl", "dp": False, "seed": seed, "final_acc": 0.1, "data_part": "shadow"})
    tab = root / "tabular-pdp" / "runs" / "run_s0"
    _put(tab / "summary.json", {"seed": 0, "levels": [2, 1, 0, 0], "settings": {
        "vanilla": {"final_mae": 0.5}, "gdp": {"final_mae": 0.7, "eps_rdp_max": 3.0, "delta": 1e-5}}})
    _put(tab / "attacks.json", {"settings": {}, "rows": [
        {"setting": "vanilla", "attack": "lira-offline", "auc": 0.55, "tpr_at_fpr_0.001": 0.0, "tpr_at_fpr_0.01": 0.0},
        {"setting": "vanilla", "attack": "attribute-inference", "member_accuracy": 0.4,
         "advantage_over_baseline": 0.25}]})
    raw = root / "tabular-pdp" / "raw-data" / "tabular-pdp" / "runs" / "run_s0"  # the sweep's raw-data twin
    _put(raw / "summary.json", {"seed": 0, "levels": [0, 0, 0, 0], "settings": {"vanilla": {"final_mae": 0.45}}})
    us = root / "ultrasound" / "runs" / "fedavg_dp_s0"
    _put(us / "summary.json", {"seed": 0, "method": "fedavg", "arch": "mobilenetv2_100", "task": "three-class",
                               "partition": "iid", "dp_sgd": True, "max_grad_norm": 1.0, "noise_multiplier": 1.1,
                               "test_accuracy": 0.6, "accounting": {"eps_rdp_max": 8.0, "delta": 1e-5}})
    _put(us / "attacks_inversion.json", {"settings": {}, "rows": [
        {"attack": "idlg", "view": "gradient", "ssim": 0.9}, {"attack": "idlg", "view": "dp-sgd", "ssim": 0.05}]})
    ul = root / "unlinkable-dfl"
    _put(ul / "runs" / "mix_s0" / "summary.json", _udfl_summary(seed=0, final_acc=0.8))
    _put(ul / "transport" / "abc.json", {"spec": _spec(), "result": {
        "label": "K=2, O=20, mu=0.1", "mixnet": True, "num_nodes": 10, "seed": 0, "agnostic_advantage": 0.02,
        "aware_advantage": 0.05, "h_relay_bits": 3.3, "h_path_bits": 6.6, "h_relay_loc_bits": 2.9}})


def _udfl_summary(**over) -> dict:
    """An unlinkable-dfl learning summary with the fields the card reads (server_app._summary)."""
    return {"seed": 0, "transport": "mixnet", "mode": "unlinkable", "num_nodes": 10, "topology": "circulant",
            "degree": 4, "max_hops": 2, "outbox": 20, "mu": 0.1, "cover": True, "fragments_per_update": 7,
            "share_ratio": 1.0, "dataset": "mnist-5k", "model": "lenet5", "num_rounds": 5, "encoding": "q8",
            "aggregator": "fedavg", "alpha": 10.0, "churn_leave": 0.0, "churn_join": 0.5, "byzantine_fraction": 0.0,
            "final_acc": 0.8, "h_relay_bits": 3.3, "h_path_bits": 6.6, **over}


def _spec(**over) -> dict:
    """A transport measurement's spec (netexp.TrafficSpec as written by the sweep)."""
    return {"num_nodes": 10, "degree": 4, "topology": "circulant", "fragments_per_peer": 7, "rounds": 1,
            "mixnet": True, "max_hops": 2, "outbox": 20, "mu": 0.1, "cover": True, "latency": 0.005, "seed": 0,
            **over}


def test_cards_of_a_synthetic_tree(tmp_path):
    _tree(tmp_path)
    page, done = write_page(tmp_path)
    assert done == ["dfl-dp", "tabular-pdp", "ultrasound", "unlinkable-dfl"]
    assert (tmp_path / "report_card.md").read_text() == page
    for study in done:
        for ext in ("csv", "md"):
            assert (tmp_path / study / f"report_card.{ext}").is_file()
    assert (tmp_path / "dfl-dp" / "report_card.png").stat().st_size > 1000
    dfl = (tmp_path / "dfl-dp" / "report_card.csv").read_text().splitlines()
    assert len(dfl) == 3  # header + No-DP + DP; shadow runs excluded
    nodp, dp = dfl[1], dfl[2]
    assert "91.00 +- 1.41" in nodp and "inf (no DP)" in nodp and "lira-offline" in nodp
    assert "0.700 +- 0.000" in nodp and "0.800" in nodp  # LiRA beats the threshold; best inversion SSIM
    # the DP runs were audited (audit.json): their own rows, audited eps, attack cells say why they are empty
    assert dp.startswith('"fl: C=1, eps_cal=2 [audited]"') and "6.3" in dp and "1.100 +- 0.000" in dp
    assert dp.count(AUDITED) == 4 and NOT_RUN not in dp
    tab = (tmp_path / "tabular-pdp" / "report_card.md").read_text()
    assert "vanilla (anonymized)" in tab and "0.250" in tab and "gdp (anonymized)" in tab
    assert "| vanilla (raw) | 1 | 0.450 |" in tab
    us = (tmp_path / "ultrasound" / "report_card.csv").read_text()
    assert "0.050" in us and "0.900" not in us  # a DP-SGD run is scored on its DP-SGD view
    ul = (tmp_path / "unlinkable-dfl" / "report_card.csv").read_text()
    assert "0.050" in ul and "6.60" in ul


def test_audit_and_missing_parts(tmp_path):
    assert audited_epsilon(tmp_path) is None
    _put(tmp_path / "audit.json", {"gdp": {"eps_lower": 0.3}, "pdp": {"eps_lower": 0.9}})
    assert audited_epsilon(tmp_path, "gdp") == 0.3 and audited_epsilon(tmp_path) == 0.9
    _tree(tmp_path)
    rows = build_card(CARD["tabular-pdp"], collect_tabular_pdp(tmp_path / "tabular-pdp"))
    gdp = next(r for r in rows if r["condition"].startswith("gdp"))
    assert gdp["MIA AUC (best attack)"] == NOT_RUN and gdp["audited eps (lower bound)"] == NOT_RUN
    with pytest.raises(TypeError, match="wants a CardSpec"):
        build_card("tabular-pdp", [])
    with pytest.raises(ValueError, match="no report card registered for"):
        write_page(tmp_path, ("nope",))
    with pytest.raises(FileNotFoundError, match="no finished runs"):
        write_card(CARD["ultrasound"], tmp_path / "empty")
    assert main(["--results-dir", str(tmp_path / "absent")]) == 2


def test_audited_runs_get_their_own_rows_and_no_attack_numbers(tmp_path):
    """Canaries change the released model: an audited run's attack files (if any) are never read."""
    tab = tmp_path / "tabular-pdp" / "runs"
    mia = {"auc": 0.9, "tpr_at_fpr_0.001": 0.5, "attack": "lira-offline"}
    for name, canaries in (("plain", 0), ("audited", 4)):
        _put(tab / name / "config.json", {"audit_canaries": canaries})
        _put(tab / name / "summary.json", {"seed": 0, "levels": [2, 1, 0, 0], "settings": {
            "vanilla": {"final_mae": 0.5}, "gdp": {"final_mae": 0.7 + canaries / 100, "eps_rdp_max": 3.0}}})
        _put(tab / name / "attacks.json", {"rows": [{**mia, "setting": k} for k in ("vanilla", "gdp")]})
    _put(tab / "audited" / "audit.json", {"gdp": {"eps_lower": 0.8}})
    assert not is_audited_run(tab / "plain") and is_audited_run(tab / "audited")
    rows = {r["condition"]: r for r in build_card(CARD["tabular-pdp"], collect_tabular_pdp(tmp_path / "tabular-pdp"))}
    assert sorted(rows) == ["gdp (anonymized)", "gdp (anonymized) [audited]", "vanilla (anonymized)"]
    audited, plain = rows["gdp (anonymized) [audited]"], rows["gdp (anonymized)"]
    assert audited["test MAE (lower is better)"].startswith("0.740") and audited["audited eps (lower bound)"] != NOT_RUN
    assert audited["MIA AUC (best attack)"] == audited["best MIA attack"] == AUDITED
    assert plain["MIA AUC (best attack)"].startswith("0.900")
    # the plain row borrows its audited twin's bound (same condition, canaries in another run), marked as such
    assert plain["audited eps (lower bound)"] == audited["audited eps (lower bound)"] + " (audited twin)"
    # ... but never from a twin with another formal epsilon (the same label, other noise)
    _put(tab / "audited" / "summary.json", {"seed": 0, "levels": [2, 1, 0, 0], "settings": {
        "vanilla": {"final_mae": 0.5}, "gdp": {"final_mae": 0.74, "eps_rdp_max": 30.0}}})
    rows = {r["condition"]: r for r in build_card(CARD["tabular-pdp"], collect_tabular_pdp(tmp_path / "tabular-pdp"))}
    assert rows["gdp (anonymized)"]["audited eps (lower bound)"] == NOT_RUN
    # vanilla of the audited run trained without canaries: both runs' vanilla models count
    assert rows["vanilla (anonymized)"]["seeds"] == 2 and rows["vanilla (anonymized)"]["MIA AUC (best attack)"] != AUDITED
    us = tmp_path / "ultrasound" / "runs" / "fedavg_audit"  # ultrasound: audit in summary.json
    _put(us / "summary.json", {"seed": 0, "method": "fedavg", "arch": "a", "task": "t", "partition": "iid",
                               "dp_sgd": False, "test_accuracy": 0.7, "audit": {"eps_lower": 0.0}})
    _put(us / "attacks_mia.json", {"rows": [mia]})
    (rec,) = collect_ultrasound(tmp_path / "ultrasound")
    assert rec["condition"].endswith("[audited]") and "mia_auc" not in rec and rec["attack_skipped"] == AUDITED


@pytest.mark.slow
def test_card_of_a_real_smoke_run(tmp_path):
    import torch

    from flower_apps.common.results import read_json
    from flower_apps.dfl_dp.attack_lira import LiraSettings, lira_for_run
    from flower_apps.dfl_dp.config import DflDpConfig
    from flower_apps.runner import run_config_in_process

    torch.set_num_threads(1)
    run_config_in_process({"study": "dfl-dp", "preset": "smoke", "results-dir": str(tmp_path), "framework": "fl",
                           "dp": True, "clip-norm": 1.0, "eps-cal": 2.0})
    (run,) = (tmp_path / "dfl-dp" / "runs").iterdir()
    row = lira_for_run(DflDpConfig(**read_json(run / "config.json")),
                       LiraSettings(num_reference=2, epochs=1, max_candidates=100))
    assert 0.0 <= row["auc"] <= 1.0 and row["n_members"] == 100
    page, done = write_page(tmp_path)
    assert done == ["dfl-dp"] and "No finished runs" in page
    card = (tmp_path / "dfl-dp" / "report_card.csv").read_text().splitlines()
    summary = read_json(run / "summary.json")
    assert len(card) == 2 and f"{summary['accounting']['eps_total']:.4g}" in card[1]
    assert f"{row['auc']:.3f}" in card[1] and "lira-offline" in card[1]
    assert not math.isnan(summary["final_acc"])


def test_unlinkable_card_joins_learning_and_linking_per_mixnet_configuration(tmp_path):
    """A learning run and a transport measurement share a row exactly when the linking depends on the
    same things (N, graph, K, O, mu, cover, fragments per peer); anything else keeps a row of its own."""
    ul = tmp_path / "unlinkable-dfl"
    for seed, acc in ((0, 0.80), (1, 0.84)):
        _put(ul / "runs" / f"mix_s{seed}" / "summary.json", _udfl_summary(seed=seed, final_acc=acc))
    _put(ul / "runs" / "twin_s1" / "summary.json", _udfl_summary(seed=1, final_acc=0.84))  # same run, other name
    _put(ul / "runs" / "partial_s0" / "summary.json", _udfl_summary(share_ratio=0.5, final_acc=0.7))
    _put(ul / "runs" / "direct_s0" / "summary.json", _udfl_summary(transport="direct", final_acc=0.81))
    _put(ul / "runs" / "float_s0" / "summary.json",  # 26 fragments: no measurement of that traffic
         _udfl_summary(transport="direct", encoding="float32", fragments_per_update=26, final_acc=0.82))
    res = {"mixnet": True, "seed": 0, "agnostic_advantage": 0.02, "aware_advantage": 0.05,
           "h_relay_bits": 4.3, "h_path_bits": 8.6, "h_relay_loc_bits": 2.9}
    _put(ul / "transport" / "a.json", {"spec": _spec(), "result": res})
    _put(ul / "transport" / "b.json", {"spec": _spec(outbox=10), "result": {**res, "aware_advantage": 0.3}})
    _put(ul / "transport" / "c.json", {"spec": _spec(mixnet=False, outbox=100),
                                       "result": {**res, "mixnet": False, "aware_advantage": 0.9}})
    rows = {r["condition"]: r for r in build_card(CARD["unlinkable-dfl"], collect_unlinkable_dfl(ul))}
    joined = ("mixnet K=2, O=20, mu=0.1; N=10, circulant d=4, 7 fragments/peer | "
              "mnist-5k lenet5, T=5, q8, share 1, fedavg, alpha 10")
    assert rows[joined]["seeds"] == "2 learning + 1 linking"
    assert rows[joined]["test accuracy (%)"].startswith("82.00 +- 2.83")
    assert rows[joined]["linking advantage"].startswith("0.050") and rows[joined]["H_relay (bits)"].startswith("4.30")
    off = "mixnet off; N=10, circulant d=4, 7 fragments/peer | mnist-5k lenet5, T=5, q8, share 1, fedavg, alpha 10"
    assert rows[off]["linking advantage"].startswith("0.900") and rows[off]["test accuracy (%)"].startswith("81.00")
    alone = "linking only: mixnet K=2, O=10, mu=0.1; N=10, circulant d=4, 7 fragments/peer"
    assert rows[alone]["test accuracy (%)"] == "-" and rows[alone]["linking advantage"].startswith("0.300")
    partial = next(r for c, r in rows.items() if c.startswith("learning only:") and "share 0.5" in c)
    assert partial["linking advantage"] == NOT_RUN
    floats = rows["mixnet off; N=10, circulant d=4, 26 fragments/peer | mnist-5k lenet5, T=5, float32, share 1, "
                  "fedavg, alpha 10"]  # a configuration nobody measured: its linking cell says so
    assert floats["linking advantage"] == NOT_RUN and floats["test accuracy (%)"].startswith("82.00")
    assert len(rows) == 5


def test_runs_of_different_configs_under_one_label_are_not_averaged_as_seeds(tmp_path):
    from flower_apps.common.report_card import split_mixed_conditions
    from flower_apps.dfl_dp.card import collect_dfl_dp

    def run(name, seed, acc, **cfg):
        folder = tmp_path / "dfl-dp" / "runs" / name
        _put(folder / "summary.json", {"framework": "fl", "dp": False, "seed": seed, "final_acc": acc})
        _put(folder / "config.json", {"framework": "fl", "dp": False, "seed": seed, "num_rounds": 20,
                                      "results_dir": str(tmp_path), "device": "cpu", **cfg})

    run("a_s0", 0, 0.90)
    run("a_s1", 1, 0.92, device="cuda")  # another seed and device: the same condition
    rows = build_card(CARD["dfl-dp"], collect_dfl_dp(tmp_path / "dfl-dp"))
    assert [(r["condition"], r["seeds"]) for r in rows] == [("fl: No-DP", 2)]
    run("b_s0", 0, 0.60, num_rounds=100, lr=0.1)  # another grid in the same results dir
    rows = build_card(CARD["dfl-dp"], collect_dfl_dp(tmp_path / "dfl-dp"))
    assert sorted((r["condition"], r["seeds"]) for r in rows) == [
        ("fl: No-DP [lr=0.1, num_rounds=100]", 1), ("fl: No-DP [lr=None, num_rounds=20]", 2)]
    # records without a config (older folders) keep their label; the helper drops its private field
    recs = split_mixed_conditions([{"condition": "x", "seed": 0, "_config": None}, {"condition": "x", "seed": 1}])
    assert recs == [{"condition": "x", "seed": 0}, {"condition": "x", "seed": 1}]
