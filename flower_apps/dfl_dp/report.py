"""Tables and figures of the dfl-dp study from the runs' summary.json files, numbered as in the paper.

A reader maps each output to the seed paper by its file name (:data:`OUTPUTS`; the README has the
same table). Table 3: utility and convergence per framework and condition (final and best
accuracy, rounds to 75%, stability round, eps_total). Table 4: clipping frequency with 95%
t-intervals over seeds. Figure 3: per-client class counts (written per run). Figures 4 and 5:
utility retention and accuracy degradation against the same seed's No-DP run, with 95%
t-interval error bars (their numbers: ``retention_degradation``, a table the paper does not
number). Figure 6a: accuracy curves with 95% t-interval bands. Figure 6b: final accuracy vs
eps_cal at C = 1, both frameworks. The attack outputs (Tables 5-6, Figures 7-8) are in
:mod:`flower_apps.dfl_dp.attack_report`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flower_apps.common.plots import colormap, save_fig, subplots
from flower_apps.common.results import atomic_write_text, read_json
from flower_apps.common.stats import summarize
from flower_apps.common.tables import group_by, write_table
from flower_apps.dfl_dp.metrics import retention_and_degradation

FW_LABEL = {"fl": "FL", "sequential-dfl": "Sequential DFL"}


def plot_class_counts(counts: np.ndarray, path: Path) -> None:
    """Stacked bars of per-client class counts (the seed paper's Figure 3)."""
    fig, ax = subplots(figsize=(max(6, counts.shape[0] * 0.08), 3.2))
    bottom = np.zeros(counts.shape[0])
    cmap = colormap("tab10")
    for k in range(counts.shape[1]):
        ax.bar(np.arange(counts.shape[0]), counts[:, k], bottom=bottom, width=0.9, color=cmap(k % 10), label=str(k))
        bottom += counts[:, k]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    ax.set_title("Per-client class counts (Dirichlet label skew)")
    ax.legend(title="class", ncol=5, fontsize=7, loc="upper right")
    save_fig(fig, path)


def is_audited(summary: dict) -> bool:
    """A run made with ``audit-canaries`` > 0: canary clients were in its cohort (docs/audit.md)."""
    return bool(summary.get("audit"))


def load_summaries(results_dir: str | Path, *, audited: bool = False) -> list[dict]:
    """The finished target runs' summaries under ``<results>/dfl-dp/runs``: the plain runs, or only the audited ones.

    An audited run is another training run: its canary clients are averaged into the released models
    and size the noise (N + K/2 members), so its accuracy is never pooled with the plain runs' over seeds.
    """
    runs = Path(results_dir) / "dfl-dp" / "runs"
    summaries = [read_json(p) for p in sorted(runs.glob("*/summary.json"))]
    return [s for s in summaries if s.get("data_part", "target") == "target"  # shadow runs serve the MIA only
            and is_audited(s) == audited]


def condition_of(s: dict) -> str:
    cond = "No-DP" if not s["dp"] else f"C={s['clip_norm']:g}, eps_cal={s['eps_cal']:g}"
    # a sampled run (client-fraction < 1) is its own cell, never averaged with full participation
    return cond + (f", q={s['client_fraction']:g} {s['client_sampling']}" if s.get("client_sampling") else "")


def _sort_key(cond: str) -> tuple:
    parts = cond.split(", ")
    q = next((float(p.split()[0][2:]) for p in parts if p.startswith("q=")), 1.0)
    if parts[0] == "No-DP":
        return (0, 0.0, 0.0, -q)
    c, e = parts[0].replace("C=", ""), parts[1].replace("eps_cal=", "")
    return (1, float(c), float(e), -q)


def build_rows(summaries: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(Table 3 rows, Table 4 rows, retention/degradation rows) aggregated over seeds."""
    groups = group_by(summaries, lambda s: (s["framework"], condition_of(s)))
    nodp = {(s["framework"], s["seed"], s["num_clients"], s["num_rounds"], s["dataset"],
             s.get("client_fraction", 1.0)): s["final_acc"] for s in summaries if not s["dp"]}
    t3, t4, rd = [], [], []
    for (fw, cond) in sorted(groups, key=lambda k: (k[0], _sort_key(k[1]))):
        runs = groups[(fw, cond)]
        n = len(runs)
        row = {"framework": FW_LABEL.get(fw, fw), "condition": cond, "seeds": n}
        for key, label, scale, digits in (("final_acc", "final acc (%)", 100, 2), ("best_acc", "best acc (%)", 100, 2),
                                          ("rounds_to_75", "rounds to 75%", 1, 1),
                                          ("stability_round", "stability round", 1, 1)):
            vals = [None if r[key] is None else r[key] * scale for r in runs]
            summ = summarize(vals)
            row[label] = summ.fmt(digits)
            row[f"_{key}"] = summ
        if runs[0]["dp"]:
            sampled = runs[0].get("accounting_sampled")
            if sampled:  # a sampled run: its amplified RDP ledger (no exact GDP value for sampled releases)
                row["eps_total"] = f"{sampled['eps_total']:.4g}"
                row["eps (exact GDP)"] = "n/a (sampled)"
            else:
                row["eps_total"] = f"{runs[0]['accounting']['eps_total']:.4g}"
                row["eps (exact GDP)"] = ("> 500" if runs[0]["accounting"]["eps_gdp_exact"] is None
                                          else f"{runs[0]['accounting']['eps_gdp_exact']:.4g}")
            # Table 4: how often the clipping bound was hit (per client update in FL, per round
            # update in sequential DFL), mean +- SD [95% t-interval] over seeds.
            clip = summarize([r["clip_frequency_pct"] for r in runs])
            t4.append({"framework": FW_LABEL.get(fw, fw), "condition": cond, "seeds": n,
                       "clipped": runs[0]["clip_unit"], "clipping frequency (%)": clip.fmt(1), "_clip": clip})
        else:
            row["eps_total"] = "inf"
            row["eps (exact GDP)"] = "inf"
        t3.append(row)
        if runs[0]["dp"]:
            ret, deg = [], []
            for r in runs:
                base = nodp.get((fw, r["seed"], r["num_clients"], r["num_rounds"], r["dataset"],
                                 r.get("client_fraction", 1.0)))
                if base is None:
                    continue
                a, b = retention_and_degradation(r["final_acc"], base)
                ret.append(a)
                deg.append(b)
            if ret:
                sr, sd_ = summarize(ret), summarize(deg)
                rd.append({"framework": FW_LABEL.get(fw, fw), "condition": cond, "seeds": len(ret),
                           "utility retention (%)": sr.fmt(2), "degradation (pp)": sd_.fmt(2),
                           "_ret": sr, "_deg": sd_})
    return t3, t4, rd


def _bar_figure(rows: list[dict], key: str, ylabel: str, path: Path) -> None:
    conds = sorted({r["condition"] for r in rows}, key=_sort_key)
    fws = sorted({r["framework"] for r in rows})
    fig, ax = subplots(figsize=(max(6, len(conds) * 0.9), 3.6))
    width = 0.8 / max(len(fws), 1)
    for j, fw in enumerate(fws):
        xs, ys, errs = [], [], []
        for i, c in enumerate(conds):
            for r in rows:
                if r["framework"] == fw and r["condition"] == c:
                    s = r[key]
                    xs.append(i + j * width)
                    ys.append(s.mean)
                    errs.append(0.0 if np.isnan(s.ci_high) else s.ci_high - s.mean)
        ax.bar(xs, ys, width=width, yerr=errs, capsize=3, label=fw)
    ax.set_xticks(np.arange(len(conds)) + width * (len(fws) - 1) / 2)
    ax.set_xticklabels(conds, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.set_title(f"{ylabel} (error bars: 95% t-interval over seeds)", fontsize=9)
    save_fig(fig, path)


def _curves_figure(summaries: list[dict], path: Path) -> None:
    groups = group_by(summaries, lambda s: (s["framework"], condition_of(s)))
    fws = sorted({k[0] for k in groups})
    fig, axes = subplots(1, len(fws), figsize=(5.5 * len(fws), 3.8), squeeze=False)
    for ax, fw in zip(axes[0], fws):
        for cond in sorted({k[1] for k in groups if k[0] == fw}, key=_sort_key):
            curves = [s["acc_curve"] for s in groups[(fw, cond)]]
            t = min(len(c) for c in curves)
            arr = np.asarray([c[:t] for c in curves]) * 100
            rounds = np.arange(1, t + 1)
            mean = arr.mean(0)
            (line,) = ax.plot(rounds, mean, label=cond, lw=1.2)
            if len(curves) > 1:
                lo, hi = zip(*[(summarize(list(arr[:, i])).ci_low, summarize(list(arr[:, i])).ci_high) for i in range(t)])
                ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.2)
        ax.set_title(FW_LABEL.get(fw, fw))
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.axhline(75, color="grey", ls=":", lw=0.8)
        ax.legend(fontsize=6)
    save_fig(fig, path)


def accuracy_vs_eps(summaries: list[dict], clip_norm: float) -> dict[str, dict]:
    """Figure 6b's numbers per framework: ``{"eps": [...], "acc": [SeedSummary...], "nodp": SeedSummary}``.

    Final accuracy (%) over seeds for every eps_cal run at ``clip_norm``; ``nodp`` is None when
    the framework has no No-DP run. Full participation only (the paper's figure): sampled runs are left out.
    """
    points = {}
    for fw in sorted({s["framework"] for s in summaries}):
        mine = [s for s in summaries if s["framework"] == fw and not s.get("client_sampling")]
        by_eps = group_by([s for s in mine if s["dp"] and s["clip_norm"] == clip_norm], lambda s: s["eps_cal"])
        base = [100 * s["final_acc"] for s in mine if not s["dp"]]
        points[fw] = {"eps": sorted(by_eps),
                      "acc": [summarize([100 * s["final_acc"] for s in by_eps[e]]) for e in sorted(by_eps)],
                      "nodp": summarize(base) if base else None}
    return points


def _accuracy_vs_eps_figure(summaries: list[dict], clip_norm: float, path: Path) -> bool:
    """Figure 6b: final accuracy vs eps_cal at one C, both frameworks; No-DP as dashed lines.

    Error bars are 95% t-intervals over seeds. Returns False (nothing written) when no run has
    that C.
    """
    points = accuracy_vs_eps(summaries, clip_norm)
    if not any(p["eps"] for p in points.values()):
        return False
    fig, ax = subplots(figsize=(5.5, 3.8))
    cmap = colormap("tab10")
    for j, (fw, p) in enumerate(points.items()):
        if p["eps"]:
            errs = [0.0 if np.isnan(st.ci_high) else st.ci_high - st.mean for st in p["acc"]]
            ax.errorbar(p["eps"], [st.mean for st in p["acc"]], yerr=errs, marker="o", capsize=3, color=cmap(j),
                        label=f"{FW_LABEL.get(fw, fw)}, C={clip_norm:g}")
        if p["nodp"] is not None:
            ax.axhline(p["nodp"].mean, color=cmap(j), ls="--", lw=1, label=f"{FW_LABEL.get(fw, fw)}, No-DP")
    ax.set_xlabel("eps_cal (per-round calibration epsilon)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title(f"Final accuracy vs eps_cal at C = {clip_norm:g} (95% t-interval over seeds)", fontsize=9)
    ax.legend(fontsize=7)
    save_fig(fig, path)
    return True


FIG6B_CLIP_NORM = 1.0  # the paper's Figure 6b fixes C = 1

# Output stem -> the paper's item, for every file the report writes (the README has this table).
OUTPUTS: dict[str, str] = {
    "runs/*/class_counts.png": "Figure 3 (per-client class counts, one per run)",
    "table3_utility": "Table 3 (utility and convergence)",
    "table4_clipping_frequency": "Table 4 (clipping frequency, 95% CIs)",
    "figure4_retention.png": "Figure 4 (utility retention)",
    "figure5_degradation.png": "Figure 5 (accuracy degradation)",
    "retention_degradation": "numbers behind Figures 4-5 (not a paper table)",
    "figure6a_accuracy_curves.png": "Figure 6a (accuracy over rounds)",
    "figure6b_accuracy_vs_eps_cal.png": "Figure 6b (final accuracy vs eps_cal at C = 1)",
}

# Names earlier versions wrote whose number now means something else (removed on rebuild so a
# stale file cannot be read as the paper's item): old name -> current name.
RETIRED = {"table4_retention.csv": "retention_degradation.csv", "table4_retention.md": "retention_degradation.md",
           "figure6_accuracy_curves.png": "figure6a_accuracy_curves.png"}


def remove_retired(out: Path, retired: dict[str, str]) -> list[str]:
    """Delete files of ``retired`` under ``out``; return the names deleted."""
    gone = []
    for old in retired:
        if (out / old).is_file():
            (out / old).unlink()
            gone.append(old)
    return gone


def write_report(results_dir: str | Path) -> str:
    """Write tables (CSV + Markdown) and figures under ``<results>/dfl-dp``; return the Markdown."""
    summaries = load_summaries(results_dir)
    audited = load_summaries(results_dir, audited=True)
    if not summaries and not audited:
        raise FileNotFoundError(f"no finished dfl-dp runs under {Path(results_dir) / 'dfl-dp' / 'runs'}")
    out = Path(results_dir) / "dfl-dp"
    remove_retired(out, RETIRED)
    md = _plain_tables(summaries, out) if summaries else ""
    if audited:  # their own table: canary clients changed what these runs trained and released
        md += "\n" + write_table(build_rows(audited)[0], out / "table3_utility_audited",
                                  "Table 3 for the audited runs (canary clients in the cohort, docs/audit.md)",
                                  "Not comparable with the plain runs' Table 3: the canaries are averaged into the "
                                  "released models and the noise is sized for N + K/2 members.")
    from flower_apps.dfl_dp.audit_report import write_audit_table

    audit = write_audit_table(results_dir)  # runs made with --audit (docs/audit.md)
    md += ("\n" + audit) if audit else ""
    atomic_write_text(out / "report.md", md)
    return md


def _plain_tables(summaries: list[dict], out: Path) -> str:
    """Tables 3-4, retention and the figures of the plain (un-audited) runs; returns their Markdown."""
    t3, t4, rd = build_rows(summaries)
    notes = sorted({n for s in summaries for n in s.get("data_notes", [])})
    md = write_table(t3, out / "table3_utility", "Table 3: utility, convergence and privacy")
    if t4:
        md += "\n" + write_table(t4, out / "table4_clipping_frequency",
                                  "Table 4: clipping frequency (mean +- SD [95% t-interval] over seeds)")
    if rd:
        md += "\n" + write_table(rd, out / "retention_degradation",
                                  "Utility retention and degradation vs No-DP (the numbers of Figures 4 and 5)")
        _bar_figure(rd, "_ret", "utility retention (%)", out / "figure4_retention.png")
        _bar_figure(rd, "_deg", "accuracy degradation (pp)", out / "figure5_degradation.png")
    _curves_figure(summaries, out / "figure6a_accuracy_curves.png")
    _accuracy_vs_eps_figure(summaries, FIG6B_CLIP_NORM, out / "figure6b_accuracy_vs_eps_cal.png")
    if notes:
        md += "\nData: " + " ".join(f"- {n}" for n in notes) + "\n"
    return md
