"""Tables 5-6 and Figures 7-8 of the dfl-dp study (attacks), from the attack phase's rows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from attacks.inversion.figures import GridRow, save_reconstruction_grid
from flower_apps.common.plots import save_fig, subplots
from flower_apps.common.stats import summarize
from flower_apps.common.tables import group_by, seed_cell, write_table
from flower_apps.dfl_dp.report import FW_LABEL

CONDITION_ORDER = ("nodp",)


def _cond_label(cond: str) -> str:
    if cond == "nodp":
        return "No-DP"
    c, e = cond[1:].split("_eps")
    return f"C={c}, eps_cal={e}"


def _cond_key(cond: str) -> tuple:
    if cond == "nodp":
        return (0, 0.0, 0.0)
    c, e = cond[1:].split("_eps")
    return (1, float(c), float(e))


def mia_tables(rows: list[dict], out: Path) -> str:
    """Table 5: AUC (and TPR at FPR 0.1% / 1%) per framework, condition, feature and classifier."""
    groups = group_by(rows, lambda r: (r["framework"], r["condition"], r["feature"], r["classifier"]))
    table = []
    for key in sorted(groups, key=lambda k: (k[0], _cond_key(k[1]), k[2], k[3])):
        g = groups[key]
        table.append({"framework": FW_LABEL.get(key[0], key[0]), "condition": _cond_label(key[1]),
                      "feature": key[2], "classifier": key[3], "seeds": len(g),
                      "ROC-AUC": seed_cell([r["auc"] for r in g], 3),
                      "TPR@FPR=0.1%": seed_cell([r["tpr_at_fpr_0.001"] for r in g], 4),
                      "TPR@FPR=1%": seed_cell([r["tpr_at_fpr_0.01"] for r in g], 4),
                      "_auc": summarize([r["auc"] for r in g])})
    md = write_table(table, out / "table5_membership_inference",
                      "Table 5: membership inference (shadow models; loss threshold as baseline)")
    _figure7(table, out / "figure7_mia_auc.png")
    return md


def _figure7(table: list[dict], path: Path) -> None:
    fws = sorted({r["framework"] for r in table})
    fig, axes = subplots(1, len(fws), figsize=(6 * len(fws), 3.6), squeeze=False)
    for ax, fw in zip(axes[0], fws):
        rs = [r for r in table if r["framework"] == fw]
        conds = list(dict.fromkeys(r["condition"] for r in rs))
        attacks = list(dict.fromkeys(f"{r['feature']}/{r['classifier']}" for r in rs))
        w = 0.8 / len(attacks)
        for j, a in enumerate(attacks):
            xs, ys, es = [], [], []
            for i, c in enumerate(conds):
                for r in rs:
                    if r["condition"] == c and f"{r['feature']}/{r['classifier']}" == a:
                        s = r["_auc"]
                        xs.append(i + j * w)
                        ys.append(s.mean)
                        es.append(0 if np.isnan(s.ci_high) else s.ci_high - s.mean)
            ax.bar(xs, ys, width=w, yerr=es, capsize=2, label=a)
        ax.axhline(0.5, color="k", lw=0.8, ls=":")
        ax.set_ylim(0.4, max(0.7, ax.get_ylim()[1]))
        ax.set_xticks(np.arange(len(conds)) + w * (len(attacks) - 1) / 2)
        ax.set_xticklabels(conds, rotation=30, ha="right", fontsize=7)
        ax.set_title(f"{fw}: membership-inference ROC-AUC", fontsize=9)
        ax.legend(fontsize=5, ncol=2)
    save_fig(fig, path)


def inversion_tables(rows: list[dict], out: Path, view: str) -> str:
    """Table 6: MSE, PSNR, SSIM per attack (3 gradients averaged within a seed, then over seeds)."""
    per: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        per[(r["framework"], r["condition"], r["attack"])][r["seed"]].append(r)
    table = []
    for key in sorted(per, key=lambda k: (k[0], _cond_key(k[1]), k[2])):
        seeds = per[key]
        row = {"framework": FW_LABEL.get(key[0], key[0]), "condition": _cond_label(key[1]), "attack": key[2],
               "seeds": len(seeds), "gradients": sum(len(v) for v in seeds.values())}
        for m, d in (("mse", 4), ("psnr", 2), ("ssim", 3), ("label_correct", 2)):
            row[m.upper() if m != "label_correct" else "label acc"] = seed_cell(
                [float(np.mean([r[m] for r in v])) for v in seeds.values()], d)
        table.append(row)
    stem = out / ("table6_gradient_inversion" + ("" if view == "gradient" else "_noised_update"))
    return write_table(table, stem, f"Table 6: gradient inversion (adversary view: {view})")


def figure8(rows: list[dict], out: Path, plan_lookup, view: str) -> None:
    """Original vs reconstructions for the first victim of the first seed, per framework and condition."""
    firsts: dict[tuple, dict[str, dict]] = defaultdict(dict)
    seed0 = min(r["seed"] for r in rows)
    for r in rows:
        if r["seed"] != seed0:
            continue
        key = (r["framework"], r["condition"])
        if firsts[key] and next(iter(firsts[key].values()))["client"] != r["client"]:
            continue
        firsts[key][r["attack"]] = r
    grid_rows, mean, std = [], None, None
    for (fw, cond) in sorted(firsts, key=lambda k: (k[0], _cond_key(k[1]))):
        recs = firsts[(fw, cond)]
        original, mean, std = plan_lookup(next(iter(recs.values())))
        grid_rows.append(GridRow(FW_LABEL.get(fw, fw), _cond_label(cond), original,
                                 {a: torch.tensor(r["reconstruction"]) for a, r in recs.items()}))
    if grid_rows:
        name = "figure8_reconstructions" + ("" if view == "gradient" else "_noised_update") + ".png"
        save_reconstruction_grid(out / name, grid_rows, ["dlg", "idlg", "invgrad"], mean, std)
