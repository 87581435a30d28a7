"""Tables 5-6 and Figures 7-8 of the dfl-dp study (attacks), numbered as in the paper.

Table 5: membership inference (ROC-AUC, TPR at low FPR); its bar chart ``mia_auc.png`` is not a
paper figure. Table 6: DLG / iDLG / InvGrad MSE, PSNR, SSIM. Figure 7: InvGrad's MSE, PSNR and
SSIM vs eps_cal, FL vs sequential DFL. Figure 8: reconstructions. :func:`write_attack_report`
rebuilds all of them from the per-run files the attack phase persisted (``attacks_mia.json``,
``attacks_inversion_<view>.json``), so ``--report-only`` needs no attack to rerun.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from attacks.inversion.figures import GridRow, save_reconstruction_grid
from flower_apps.common.plots import colormap, save_fig, subplots
from flower_apps.common.results import read_json
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
                      "Table 5: membership inference (shadow models; loss threshold as baseline; "
                      "offline LiRA when run)")
    _mia_auc_figure(table, out / "mia_auc.png")
    return md


def _mia_auc_figure(table: list[dict], path: Path) -> None:
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


def _per_seed(rows: list[dict], metric: str) -> list[float]:
    """One value per seed: the mean over that seed's victim gradients (as Table 6 aggregates)."""
    by_seed = group_by(rows, lambda r: r["seed"])
    return [float(np.mean([r[metric] for r in v])) for v in by_seed.values()]


def inversion_vs_eps(rows: list[dict], metric: str, clip_norm: float = 1.0,
                     attack: str = "invgrad") -> dict[str, dict]:
    """Figure 7's numbers per framework: ``{"eps": [...], "stat": [SeedSummary...], "nodp": SeedSummary}``.

    Each seed contributes the mean over its victim gradients (as Table 6), then mean and 95%
    t-interval over seeds; ``nodp`` is None when the framework has no No-DP rows.
    """
    rows = [r for r in rows if r["attack"] == attack]
    points = {}
    for fw in sorted({r["framework"] for r in rows}):
        mine = [r for r in rows if r["framework"] == fw]
        dp = group_by([r for r in mine if r["condition"] != "nodp" and _cond_key(r["condition"])[1] == clip_norm],
                      lambda r: _cond_key(r["condition"])[2])
        base = [r for r in mine if r["condition"] == "nodp"]
        points[fw] = {"eps": sorted(dp), "stat": [summarize(_per_seed(dp[e], metric)) for e in sorted(dp)],
                      "nodp": summarize(_per_seed(base, metric)) if base else None}
    return points


def figure7(rows: list[dict], path: Path, clip_norm: float = 1.0, attack: str = "invgrad") -> bool:
    """The paper's Figure 7: InvGrad MSE, PSNR and SSIM vs eps_cal at C = ``clip_norm``, FL vs DFL.

    Error bars: 95% t-intervals over seeds; No-DP as a dashed line. Returns False (nothing
    written) when there are no rows of ``attack``.
    """
    if not any(r["attack"] == attack for r in rows):
        return False
    fig, axes = subplots(1, 3, figsize=(13, 3.6), squeeze=False)
    cmap = colormap("tab10")
    for ax, (metric, label) in zip(axes[0], (("mse", "MSE"), ("psnr", "PSNR (dB)"), ("ssim", "SSIM"))):
        for j, (fw, p) in enumerate(inversion_vs_eps(rows, metric, clip_norm, attack).items()):
            if p["eps"]:
                errs = [0.0 if np.isnan(st.ci_high) else st.ci_high - st.mean for st in p["stat"]]
                ax.errorbar(p["eps"], [st.mean for st in p["stat"]], yerr=errs, marker="o", capsize=3,
                            color=cmap(j), label=f"{FW_LABEL.get(fw, fw)}, C={clip_norm:g}")
            if p["nodp"] is not None:
                ax.axhline(p["nodp"].mean, color=cmap(j), ls="--", lw=1, label=f"{FW_LABEL.get(fw, fw)}, No-DP")
        ax.set_xlabel("eps_cal")
        ax.set_ylabel(label)
        ax.set_title(f"{attack}: {label}", fontsize=9)
        ax.legend(fontsize=6)
    save_fig(fig, path)
    return True


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
    suffix = "" if view == "gradient" else "_noised_update"
    figure7(rows, out / f"figure7_inversion_vs_eps_cal{suffix}.png")
    return write_table(table, out / f"table6_gradient_inversion{suffix}",
                       f"Table 6: gradient inversion (adversary view: {view})")


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
        assert mean is not None and std is not None  # typing: the loop set them whenever it added a row
        name = "figure8_reconstructions" + ("" if view == "gradient" else "_noised_update") + ".png"
        save_reconstruction_grid(out / name, grid_rows, ["dlg", "idlg", "invgrad"], mean, std)


# Output stem -> the paper's item (the README has this table; see also report.OUTPUTS).
OUTPUTS: dict[str, str] = {
    "table5_membership_inference": "Table 5 (membership inference)",
    "mia_auc.png": "bar chart of Table 5's ROC-AUCs (not a paper figure)",
    "table6_gradient_inversion": "Table 6 (gradient inversion: DLG, iDLG, InvGrad)",
    "figure7_inversion_vs_eps_cal.png": "Figure 7 (InvGrad MSE / PSNR / SSIM vs eps_cal, FL vs DFL)",
    "figure8_reconstructions.png": "Figure 8 (original vs reconstructions)",
}
RETIRED = {"figure7_mia_auc.png": "mia_auc.png"}  # the old figure7 was the MIA AUC chart, not the paper's


def load_attack_rows(results_dir: str | Path) -> tuple[list[dict], dict[str, list[dict]]]:
    """(MIA rows, inversion rows per view) persisted under ``<results>/dfl-dp/runs/*``.

    Each inversion row gets ``_run`` (its run folder) so Figure 8 can find the run's data.
    """
    runs = sorted((Path(results_dir) / "dfl-dp" / "runs").glob("*/"))
    mia: list[dict] = []
    inversion: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        if (run / "attacks_mia.json").is_file():
            mia += read_json(run / "attacks_mia.json")
        if (run / "attacks_lira.json").is_file():  # offline LiRA (attack_lira.py): one more Table 5 row
            mia.append(read_json(run / "attacks_lira.json")["row"])
        for f in sorted(run.glob("attacks_inversion_*.json")):
            view = f.stem.removeprefix("attacks_inversion_")
            inversion[view] += [{**r, "_run": str(run)} for r in read_json(f)["rows"]]
    return mia, dict(inversion)


def _lookup_from_run_folder(row: dict):
    """Original image, mean and std of a row's victim, from the run's resolved config.json."""
    from datasets.image_plan import build_image_plan
    from flower_apps.dfl_dp.config import DflDpConfig
    from flower_apps.dfl_dp.data import data_key

    cfg = DflDpConfig(**read_json(Path(row["_run"]) / "config.json"))
    plan = build_image_plan(data_key(cfg))
    return plan.x[plan.train_part][row["index"]], plan.mean, plan.std


def write_attack_report(results_dir: str | Path, plan_lookup=None) -> str:
    """Rebuild Tables 5-6 and Figures 7-8 from the persisted attack results; '' when there are none.

    ``plan_lookup(row) -> (original, mean, std)`` finds a victim's image for Figure 8 (default:
    rebuild the run's data plan from its ``config.json``).
    """
    from flower_apps.dfl_dp.report import remove_retired

    out = Path(results_dir) / "dfl-dp"
    mia, inversion = load_attack_rows(results_dir)
    if not mia and not inversion:
        return ""
    remove_retired(out, RETIRED)
    md = mia_tables(mia, out) if mia else ""
    for view in sorted(inversion, key=lambda v: (v != "gradient", v)):
        md += "\n" + inversion_tables(inversion[view], out, view)
        figure8(inversion[view], out, plan_lookup or _lookup_from_run_folder, view)
    return md
