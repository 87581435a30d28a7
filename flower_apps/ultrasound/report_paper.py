"""The paper's remaining tables, built from finished runs (never by hand).

* Table 11 per architecture: for each backbone, federated (each FL algorithm) vs centralized.
* Tables 12-14: DP-SGD per task (12 normal vs abnormal, 13 benign vs malignant, 14 three classes),
  each DP row beside the matching non-DP run and the cost in accuracy / AUC points.
* Table 1 and Figure 3: epsilon against the noise multiplier eta (the paper's z): the paper's
  basic-composition estimate sqrt(T) sqrt(2 ln(1.25/delta)) / eta beside the RDP accountant
  (dp-accounting, Poisson-subsampled Gaussian), at the paper's scale and at each run's actual
  sample rate and number of steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flower_apps.common.plots import save_fig, subplots
from flower_apps.common.tables import group_by
from privacy.dpsgd import DpSgdEvent, paper_sqrt_t_bound, rdp_epsilon

TASK_TABLE = {"normal-vs-abnormal": 12, "benign-vs-malignant": 13, "three-class": 14}
ETAS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
# The paper's scale: 15,847 images, 80% train over K = 8 clients, batch 32, T = 100 rounds of E = 5 epochs.
PAPER_SCALE: dict[str, Any] = {"n_per_client": int(0.8 * 15847) // 8, "batch_size": 32, "epochs": 100 * 5, "delta": 1e-5}


def per_arch_rows(rows: list[dict]) -> list[dict]:
    """Table 11 per architecture: every FL method vs the same backbone's centralized run (accuracy, AUC)."""
    out = []
    for (scale, task, part, arch), grp in sorted(group_by(rows, lambda r: (r["scale"], r["task"], r["partition"],
                                                                            r["arch"])).items()):
        cen = next((r for r in grp if r["method"] == "Centralized"), None)
        for r in grp:
            if r["method"] in ("Centralized", "Local-only"):
                continue
            row = {"scale": scale, "task": task, "partition": part, "arch": arch, "FL method": r["method"],
                   "seeds": r["seeds"], "FL acc (%)": r["accuracy (%)"], "FL AUC (%)": r["auc (%)"]}
            if cen is not None:
                row["centralized acc (%)"] = cen["accuracy (%)"]
                row["centralized AUC (%)"] = cen["auc (%)"]
                row["delta acc (pp)"] = f"{r['_accuracy'].mean - cen['_accuracy'].mean:+.2f}"
            else:
                row.update({"centralized acc (%)": "-", "centralized AUC (%)": "-", "delta acc (pp)": "-"})
            row["majority-class acc (%)"] = f"{r['_majority']:.2f}"
            out.append(row)
    return out


def dp_cost_rows(nodp: list[dict], dp: list[dict]) -> dict[int, list[dict]]:
    """Tables 12-14: per task, each DP-SGD row with the matching non-DP row and the cost in points."""
    base = {(r["scale"], r["task"], r["partition"], r["arch"], r["method"]): r for r in nodp}
    tables: dict[int, list[dict]] = {}
    for r in dp:
        b = base.get((r["scale"], r["task"], r["partition"], r["arch"], r["method"]))
        row = {"scale": r["scale"], "partition": r["partition"], "arch": r["arch"], "method": r["method"],
               "DP-SGD": r["DP-SGD"], "seeds": r["seeds"], "DP acc (%)": r["accuracy (%)"],
               "DP F1 (%)": r["f1 (%)"], "DP AUC (%)": r["auc (%)"],
               "no-DP seeds": b["seeds"] if b else 0,
               "no-DP acc (%)": b["accuracy (%)"] if b else "-", "no-DP AUC (%)": b["auc (%)"] if b else "-",
               "DP cost acc (pp)": f"{b['_accuracy'].mean - r['_accuracy'].mean:+.2f}" if b else "-",
               "DP cost AUC (pp)": f"{b['_auc'].mean - r['_auc'].mean:+.2f}" if b else "-",
               "majority-class acc (%)": f"{r['_majority']:.2f}",
               "eps RDP (max client)": r["eps RDP (max client)"], "eps paper sqrt(T)": r["eps paper sqrt(T)"],
               "step time vs no-DP": r["step time vs no-DP"]}
        tables.setdefault(TASK_TABLE.get(r["task"], 0), []).append(row)
    return tables


def _settings(summaries: list[dict]) -> list[tuple[str, float, int, float]]:
    """(label, q, steps, delta): the paper's scale, then each distinct DP run setting (its max-epsilon client)."""
    p = PAPER_SCALE
    q = p["batch_size"] / p["n_per_client"]
    out = [(f"paper scale (n_k = {p['n_per_client']}, B = 32, T x E = 500 epochs)", q,
            p["epochs"] * math.ceil(1 / q), p["delta"])]
    seen = set()
    for s in summaries:
        acc = s.get("accounting")
        if not acc or not acc.get("per_client"):
            continue
        worst = max(acc["per_client"], key=lambda c: c["eps_rdp"])
        key = (round(worst["sample_rate"], 6), int(worst["steps"]), acc["delta"])
        if key not in seen:
            seen.add(key)
            out.append((f"{s['dataset']} {s['image_size']}px T{s['num_rounds']} E{s['local_epochs']} "
                        f"(max-eps client)", *key))
    return out


def epsilon_rows(summaries: list[dict], etas: tuple[float, ...] = ETAS) -> list[dict]:
    """Table 1: epsilon for each eta under basic composition (the paper) and the RDP accountant."""
    rows = []
    for label, q, steps, delta in _settings(summaries):
        for eta in etas:
            rows.append({"setting": label, "q": f"{q:.4g}", "steps": steps, "delta": f"{delta:g}", "eta (z)": eta,
                         "eps paper sqrt(T)": paper_sqrt_t_bound(eta, steps, delta),
                         "eps RDP": rdp_epsilon([DpSgdEvent(eta, q, steps)], delta)})
    return rows


def epsilon_figure(rows: list[dict], path: Path) -> None:
    """Figure 3: epsilon against eta, both accountings, log scale."""
    fig, ax = subplots(figsize=(5.5, 3.6))
    for setting, grp in group_by(rows, lambda r: r["setting"]).items():
        etas = [r["eta (z)"] for r in grp]
        (line,) = ax.plot(etas, [r["eps RDP"] for r in grp], marker="o", lw=1.2, label=f"RDP: {setting}")
        ax.plot(etas, [r["eps paper sqrt(T)"] for r in grp], ls="--", color=line.get_color(), lw=1.0,
                label=f"paper sqrt(T): {setting}")
    ax.set_yscale("log")
    ax.set_xlabel("noise multiplier eta (z)")
    ax.set_ylabel("epsilon per client")
    ax.set_title("Figure 3 style: epsilon vs eta (basic composition vs RDP)", fontsize=8)
    ax.legend(fontsize=5)
    save_fig(fig, path)


def write_paper_tables(nodp: list[dict], dp: list[dict], summaries: list[dict], out: Path,
                       write_table: Callable[..., str], caveat: str, dp_note: str = "") -> str:
    """Table 11 per architecture, Tables 12-14 per task, Table 1 + Figure 3; returns their Markdown.

    ``dp_note`` precedes ``caveat`` under Tables 12-14 (what their step-time column means)."""
    md = ""
    if nodp:
        md += write_table(per_arch_rows(nodp), out / "table11_per_arch",
                          "Table 11 per architecture: federated vs centralized, same backbone", caveat) + "\n"
    names = {12: "normal vs abnormal", 13: "benign vs malignant", 14: "three classes", 0: "other tasks"}
    for num, rows in sorted(dp_cost_rows(nodp, dp).items()):
        md += write_table(rows, out / f"table{num}_dp" if num else out / "table_dp_other",
                          f"Table {num or '12-14'} style: DP-SGD on {names[num]} (cost = no-DP minus DP, points)",
                          f"{dp_note} {caveat}".strip()) + "\n"
    eps = epsilon_rows(summaries)
    md += write_table(eps, out / "table1_epsilon", "Table 1 style: epsilon vs eta (per client, delta as listed)",
                      "eps paper sqrt(T): the paper's basic-composition estimate sqrt(T) sqrt(2 ln(1.25/delta)) / eta "
                      "(not a valid DP bound for subsampled steps); eps RDP: dp-accounting's RDP accountant, "
                      "PoissonSampled(q, Gaussian(eta)) composed over the steps.") + "\n"
    epsilon_figure(eps, out / "figure3_epsilon_vs_eta.png")
    return md
