"""Tables and figures of the tabular-pdp study: per run, and over a sweep's runs.

Per run: the anonymization report (Table II), the drift heatmap (Figure 1) and the
three-setting comparison with per-client accounting (Table III). Over a sweep: Table III as
mean +- sample SD [95% t-interval] over seeds beside the paper's values, Table II beside the
paper's ranges, and the detector's detection and false-positive rates per poison kind.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np

from flower_apps.common.plots import save_fig, subplots
from flower_apps.common.results import atomic_write_json, atomic_write_text, read_json
from flower_apps.common.tables import group_by, seed_cell, write_table
from privacy.anonymization import QUASI_IDENTIFIERS
from privacy.drift import DriftReport, detection_rates

# Paper, Table III (MAE mean +- SD over 10 runs, MRE) and Table II (ranges over the ten countries).
PAPER_TABLE3 = {"vanilla": ("0.578 +- 0.006", "0.125"), "gdp": ("0.847 +- 0.273", "0.182"),
                "pdp": ("0.836 +- 0.270", "0.177")}
PAPER_TABLE2 = {"levels": [2, 1, 0, 0], "arirec": (0.1168, 0.1214), "t": (0.20, 0.32)}
SETTING_LABEL = {"vanilla": "Vanilla FL (FedAvg)", "gdp": "FL + GDP", "pdp": "FL + PDP (ARIREC)"}


def anonymization_rows(summary_like: dict) -> list[dict]:
    """Per-client rows of the anonymization report (works on a run summary)."""
    rows = []
    own, harm = summary_like["own_levels"], summary_like["anonymization"]
    for cid in sorted({*own, *harm, *summary_like["skipped"]}, key=int):
        o, h = own.get(cid, {}), harm.get(cid)
        row = {"client": int(cid), "region": summary_like["regions"].get(cid, ""),
               "own levels": o.get("levels", "-"), "suppressed (own)": o.get("suppressed", "-")}
        if h:
            row.update({"suppressed (harmonized)": h["suppressed"], "records": f"{h['n_records']}/{h['n_original']}",
                        "classes": h["n_classes"], "k": h["k"], "l": h["l"], "t": f"{h['t']:.3f}",
                        "ARIREC": f"{h['arirec']:.4f}"})
        else:
            row.update({"suppressed (harmonized)": "-", "records": "-", "classes": "-", "k": "-", "l": "-", "t": "-",
                        "ARIREC": f"skipped: {summary_like['skipped'].get(cid, '')}"})
        rows.append(row)
    return rows


def write_anonymization(anon, cfg, out: Path) -> str:
    """anonymization.{json,csv,md} of one run."""
    data = {"levels": list(anon.levels), "quasi_identifiers": list(QUASI_IDENTIFIERS),
            "levels_source": anon.levels_source, "k": cfg.k, "suppression_limit": cfg.suppression,
            "sensitive_attribute": ("Target_Severity_Score" if cfg.sa_bin_width == 0 else
                                    f"Target_Severity_Score in bins of {cfg.sa_bin_width:g}"),
            "own_levels": {str(c): v for c, v in anon.own.items()},
            "anonymization": {str(c): v for c, v in anon.harmonized.items()},
            "regions": {str(c): r for c, r in anon.regions.items()},
            "skipped": {str(c): v for c, v in anon.skipped.items()},
            "computed_on": "each client's whole table (before the 80/20 split), after harmonization and suppression"}
    atomic_write_json(out / "anonymization.json", data)
    note = (f"Harmonized levels {dict(zip(QUASI_IDENTIFIERS, anon.levels))} ({anon.levels_source}); k={cfg.k}, "
            f"suppression limit {cfg.suppression:.0%}; sensitive attribute: {data['sensitive_attribute']}. "
            f"k and l from pycanon, t with pycanon's ordered-EMD definition, ARIREC = mean 1/|EC|.")
    return write_table(anonymization_rows(data), out / "anonymization", "Anonymization (Table II)", note)


def plot_heatmap(divergence: np.ndarray, labels: list[str], flagged: list[int], path: Path, title: str) -> None:
    """Figure 1: the pairwise divergence matrix, flagged clients' labels in red."""
    n = len(labels)
    fig, ax = subplots(figsize=(1.0 + 0.55 * n, 0.6 + 0.5 * n))
    im = ax.imshow(divergence, cmap="viridis")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_yticklabels(labels, fontsize=7)
    for i in flagged:
        ax.get_xticklabels()[i].set_color("red")
        ax.get_yticklabels()[i].set_color("red")
    if n <= 12:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{divergence[i, j]:.2f}", ha="center", va="center", fontsize=5, color="white")
    fig.colorbar(im, ax=ax, label="d_ij")
    ax.set_title(title, fontsize=9)
    save_fig(fig, path)


def write_drift(report: DriftReport, regions: dict[int, str], poisoned: int | None, out: Path) -> None:
    """drift.json and drift_heatmap.png of one run."""
    atomic_write_json(out / "drift.json", {**report.to_json(), "poisoned_client": poisoned})
    labels = [f"{c}:{regions.get(c, '')}" + (" (poisoned)" if c == poisoned else "") for c in report.client_ids]
    flagged_pos = [report.client_ids.index(c) for c in report.flagged]
    plot_heatmap(report.divergence, labels, flagged_pos, out / "drift_heatmap.png",
                 f"Pairwise divergence after round 1; flagged: {list(report.flagged) or 'none'}")


def _eps(x: float | None) -> str:
    return "inf" if x is None or x == float("inf") else f"{x:.4g}"


def write_run_table(summary: dict, out: Path) -> str:
    """table3.{csv,md} of one run."""
    rows = []
    for s, v in summary["settings"].items():
        row: dict[str, object] = {"setting": SETTING_LABEL[s], "MAE": f"{v['final_mae']:.4f}",
                                  "MRE": f"{v['final_mre']:.4f}", "paper MAE": PAPER_TABLE3[s][0],
                                  "paper MRE": PAPER_TABLE3[s][1]}
        if s == "vanilla":
            row.update({"sigma (aggregate)": 0, "eps per client (RDP)": "inf", "eps server view": "inf"})
        else:
            acc = v["accounting"].values()
            sv = [a.get("eps_server_view_rdp") for a in acc if "eps_server_view_rdp" in a]
            row.update({"sigma (aggregate)": f"{v['sigma_release']:.4g}",
                        "eps per client (RDP)": f"{_eps(v['eps_rdp_min'])}..{_eps(v['eps_rdp_max'])}",
                        "eps server view": f"{_eps(min(sv))}..{_eps(max(sv))}" if sv else "inf"})
        rows.append(row)
    delta = next((v["delta"] for v in summary["settings"].values() if "delta" in v), "-")
    est = summary["clip_norm_estimate"]  # None with fewer than 3 clients (the robust estimate needs 3 norms)
    note = (f"C = {summary['clip_norm']:.4g} ({summary['clip_mode']}; estimate "
            f"{'n/a' if est is None else format(est, '.4g')}), "
            f"n_eps = {summary['noise_multiplier']:g}, delta = {delta}, "
            f"{summary['num_rounds']} rounds x {summary['local_epochs']} local epochs, participants "
            f"{summary['participants']}.")
    return write_table(rows, out / "table3", "Table III (this run)", note)


# ----------------------------------------------------------------------------- sweep level


def is_audited(summary: dict) -> bool:
    """A run made with ``tab-audit-canaries`` > 0: canary clients were in its GDP / PDP cohorts (docs/audit.md)."""
    return any("audit" in v for v in summary.get("settings", {}).values())


def load_summaries(results_dir: str | Path, *, audited: bool = False) -> list[dict]:
    """The finished runs' summaries under ``<results>/tabular-pdp/runs``: the plain runs, or only the audited ones.

    An audited run is another training run: its canaries share the FedAvg mean and the noise is sized
    for the real clients and the canaries together, so its MAE / MRE are never pooled with the plain runs'.
    """
    runs = Path(results_dir) / "tabular-pdp" / "runs"
    return [s for s in (read_json(p) for p in sorted(runs.glob("*/summary.json"))) if is_audited(s) == audited]


def table3_rows(summaries: list[dict]) -> list[dict]:
    """Table III over seeds: runs with training and no poison, grouped by setting and scale."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in summaries:
        if s["poison"] != "none":
            continue
        for name, v in s["settings"].items():
            groups[(name, s["local_epochs"], s["num_rounds"], s["dataset"])].append({**v, "_run": s})
    rows = []
    order = {"vanilla": 0, "gdp": 1, "pdp": 2}
    for (name, epochs, rounds, dataset) in sorted(groups, key=lambda k: (k[1], k[2], k[3], order[k[0]])):
        runs = groups[(name, epochs, rounds, dataset)]
        row = {"setting": SETTING_LABEL[name], "scale": f"{rounds} rounds x {epochs} epochs", "seeds": len(runs),
               "MAE": seed_cell([r["final_mae"] for r in runs], 3), "MRE": seed_cell([r["final_mre"] for r in runs], 3),
               "paper MAE": PAPER_TABLE3[name][0], "paper MRE": PAPER_TABLE3[name][1],
               "C (mean)": f"{np.mean([r['_run']['clip_norm'] for r in runs]):.3g}"}
        if name == "vanilla":
            row.update({"eps per client (RDP, delta)": "inf", "eps server view": "inf"})
        else:
            lo = min(r["eps_rdp_min"] for r in runs)
            hi = max(r["eps_rdp_max"] for r in runs)
            sv = [a["eps_server_view_rdp"] for r in runs for a in r["accounting"].values()
                  if "eps_server_view_rdp" in a]
            row.update({"eps per client (RDP, delta)": f"{_eps(lo)}..{_eps(hi)} ({runs[0]['delta']:g})",
                        "eps server view": (f"{_eps(min(sv))}..{_eps(max(sv))}" if sv
                                            else "inf (no noise before the server)")})
        rows.append(row)
    return rows


def detection_rows(summaries: list[dict]) -> list[dict]:
    """Detection rate and FPR per poison kind over every run (clean runs give the FPR with no attacker)."""
    groups = group_by(summaries, lambda s: s["poison"])
    rows = []
    for kind in sorted(groups, key=lambda k: (k != "none", k)):
        runs = groups[kind]
        rates = detection_rates([r["drift"]["flagged"] for r in runs], [r["poisoned_client"] for r in runs],
                                [r["drift"]["client_ids"] for r in runs])
        z = [r["drift"]["z_scores"][r["drift"]["client_ids"].index(r["poisoned_client"])] for r in runs
             if r["poisoned_client"] in r["drift"]["client_ids"]]
        rows.append({"poison": kind, "runs": len(runs),
                     "detection rate": "-" if kind == "none" else f"{rates['detections']}/{rates['poisoned_runs']}",
                     "false-positive rate": f"{rates['false_positives']}/{rates['honest_client_checks']} "
                                            f"({rates['false_positive_rate']:.3f})",
                     "poisoned z (median)": f"{np.median(z):.1f}" if z else "-",
                     "rule": f"z > {runs[0]['drift']['threshold']:g} and m_i >= "
                             f"{runs[0]['drift'].get('min_ratio', 1.0):g} x median(m)"})
    return rows


def rule_sensitivity_rows(summaries: list[dict], ratios=(1.0, 1.25, 1.5, 2.0)) -> list[dict]:
    """Detection and false-positive rates if the ratio floor had been different (same z threshold),
    recomputed from the stored median divergences (no retraining)."""
    from privacy.drift import robust_z_scores

    rows = []
    for ratio in ratios:
        flagged, poisoned, parts = [], [], []
        for s in summaries:
            d = s["drift"]
            med = np.asarray(d["median_divergence"])
            z = robust_z_scores(cast("Sequence[float]", med))  # typed in privacy/drift.py: reads any array-like
            r = med / np.median(med)
            flagged.append([c for c, zi, ri in zip(d["client_ids"], z, r) if zi > d["threshold"] and ri >= ratio])
            poisoned.append(s["poisoned_client"])
            parts.append(d["client_ids"])
        rates = detection_rates(flagged, poisoned, parts)
        rows.append({"min ratio": ratio, "detection rate": f"{rates['detections']}/{rates['poisoned_runs']}",
                     "false-positive rate": f"{rates['false_positives']}/{rates['honest_client_checks']}"})
    return rows


def table2_rows(summary: dict) -> list[dict]:
    """Our anonymization ranges beside the paper's Table II."""
    harm = summary["anonymization"].values()
    ar = [h["arirec"] for h in harm]
    t = [h["t"] for h in harm]
    supp = [h["suppressed"] for h in harm]
    return [{"quantity": "harmonized levels [Age, Gender, Year, Cancer_Type]", "ours": summary["levels"],
             "paper": PAPER_TABLE2["levels"]},
            {"quantity": "ARIREC per client", "ours": f"{min(ar):.4f}..{max(ar):.4f}",
             "paper": "{:.4f}..{:.4f}".format(*PAPER_TABLE2["arirec"])},
            {"quantity": "t-closeness per client", "ours": f"{min(t):.3f}..{max(t):.3f}",
             "paper": "{:.2f}..{:.2f}".format(*PAPER_TABLE2["t"])},
            {"quantity": "suppressed records per client", "ours": f"{min(supp)}..{max(supp)}", "paper": "-"}]


def write_report(results_dir: str | Path) -> str:
    """Tables (CSV + Markdown) and figures under ``<results>/tabular-pdp``; returns the Markdown."""
    summaries = load_summaries(results_dir)
    audited = load_summaries(results_dir, audited=True)
    if not summaries and not audited:
        raise FileNotFoundError(f"no finished tabular-pdp runs under {Path(results_dir) / 'tabular-pdp' / 'runs'}")
    out = Path(results_dir) / "tabular-pdp"
    md = _plain_tables(summaries, out) if summaries else ""
    t3a = table3_rows(audited)
    if t3a:  # their own table: canary clients changed what these runs trained and released
        md += "\n" + write_table(t3a, out / "table3_comparison_audited",
                                  "Table III for the audited runs (canary clients in the cohort, docs/audit.md)",
                                  "Not comparable with the plain runs' Table III: the canaries share the FedAvg mean "
                                  "and the noise is sized for the clients and the canaries together.")
    from flower_apps.tabular_pdp.audit_report import write_audit_table

    audit = write_audit_table(results_dir)  # runs made with --audit (docs/audit.md)
    md += ("\n" + audit) if audit else ""
    atomic_write_text(out / "report.md", md)
    return md


def _plain_tables(summaries: list[dict], out: Path) -> str:
    """Tables II-III, drift detection and the heatmaps of the plain (un-audited) runs; returns their Markdown."""
    first = summaries[0]
    md = write_table(anonymization_rows(first), out / "table2_anonymization",
                     f"Anonymization per client (run {first['run']})",
                     "Computed on: " + "; ".join(first["data_notes"]) + ". Each client's whole table (before the "
                     "80/20 split); identical in every run (the table is fixed, seeds vary splits and training).")
    md += "\n" + write_table(table2_rows(first), out / "table2_vs_paper", "Table II: ours vs paper")
    t3 = table3_rows(summaries)
    if t3:
        md += "\n" + write_table(t3, out / "table3_comparison", "Table III: test MAE / MRE over seeds, with accounting",
                                 "mean +- sample SD [95% t-interval] over seeds; eps: per-client epsilon of the "
                                 "released models (min..max over clients and seeds); server view: what the trusted "
                                 "server sees of each client (PDP only).")
    md += "\n" + write_table(detection_rows(summaries), out / "drift_detection",
                             "Drift detection (robust z of median divergence, after round 1)")
    md += "\n" + write_table(rule_sensitivity_rows(summaries), out / "drift_rule_sensitivity",
                             "Drift rule: rates for other ratio floors (z threshold unchanged), all runs")
    for tag, pick in (("clean", lambda s: s["poison"] == "none"), ("poisoned", lambda s: s["poison"] != "none")):
        s = next((x for x in summaries if pick(x)), None)
        if s is not None:
            d = s["drift"]
            labels = [f"{c}:{s['regions'].get(str(c), '')}" + (" (poisoned)" if c == s["poisoned_client"] else "")
                      for c in d["client_ids"]]
            plot_heatmap(np.asarray(d["divergence"]), labels, [d["client_ids"].index(c) for c in d["flagged"]],
                         out / f"figure1_divergence_{tag}.png", f"{s['run']}: flagged {d['flagged'] or 'none'}")
    return md
