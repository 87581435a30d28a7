"""Tables and figures of the ultrasound study: per run, and over every finished run (the sweep's report).

Per run (:func:`write_run_outputs`): Table 2 (partition), final metrics, per-client evaluation,
DP accounting, communication cost, confusion matrix and convergence figures.

Over runs (:func:`write_report`), mean +- sample SD [95% t-interval] over seeds:
Table 2 (partitions), Table 4 (communication), Tables 5-10 (utility per task, partition,
backbone and method), Table 11 (best FL vs centralized, with delta, beside the paper),
Tables 12-14 (DP-SGD with FedAvg / FedProx / FedAdam: utility, epsilon, overhead),
Table 15 (clip norm x noise multiplier ablation), per-client table, convergence figures; and from
:mod:`flower_apps.ultrasound.report_paper`: Table 11 per architecture, Tables 12 / 13 / 14 per task with
the DP cost in points, Table 1 and Figure 3 (epsilon vs eta).
Every comparison states the dataset-size caveat.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from flower_apps.common import tables
from flower_apps.common.plots import integer_ticks, save_fig, subplots
from flower_apps.common.results import atomic_write_text, read_json
from flower_apps.common.stats import summarize
from flower_apps.common.tables import csv_text, group_by
from flower_apps.ultrasound.audit import AUDIT_NOTE, audit_cells, audit_rows
from flower_apps.ultrasound.report_paper import write_paper_tables
from flower_apps.ultrasound.sampling_variance import combine, run_ses

METRICS = ("accuracy", "f1", "precision", "recall", "specificity", "auc")
METHOD_LABEL = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedadam": "FedAdam (FedOpt)",
                "centralized": "Centralized", "local": "Local-only"}
METHOD_ORDER = ("centralized", "fedavg", "fedprox", "fedadam", "local")
STEP_NOTE = ("step time vs no-DP: mean DP step time over the matching non-DP run's; '(head only)': the DP run "
             "trains only the classifier (frozen-bn-head) and the non-DP run every layer, so the ratio is that "
             "recipe's saving, not DP-SGD's overhead on the same training (benchmarks/ultrasound_dpsgd_overhead.py); "
             "'cached trunk': the classifier trained on trunk features computed once (no feature-skew augmentation).")
CAVEAT = ("Dataset-size caveat: the paper trains on 15,847 breast-ultrasound images; the public BUSI set has 780 "
          "(at most 624 train / 78 validation / 78 test here), so every number beside the paper's is a small-data, "
          "often reduced-scale replication, not a like-for-like comparison.")
SYNTHETIC_WARNING = "**SYNTHETIC DATA (smoke run): these numbers describe a generator, not ultrasound.**"
# The paper's reference numbers quoted in the issue (accuracy, %).
PAPER_REFERENCE = {
    "normal-vs-abnormal": "centralized all backbones > 97; FedAvg DenseNet-121 98.52; "
                          "DP C=1.5, z=2: 70-86 (ResNet-50 ~50)",
    "three-class": "FedOpt ViT-small 89.53; ResNet-50 ~76; MobileNetV2 ~67",
    "benign-vs-malignant": "-",
}


def write_table(rows: list[dict], stem: Path, title: str, note: str = "") -> str:
    """:func:`flower_apps.common.tables.write_table`, float cells of the Markdown to 4 significant digits."""
    return tables.write_table(rows, stem, title, note, float_format=".4g")


# ----------------------------------------------------------------------------- per run
def write_run_outputs(out: Path, summary: dict, rounds: list[dict], partition_rows: list[dict], info: dict) -> None:
    """The run folder's tables (CSV + Markdown) and figures."""
    note = SYNTHETIC_WARNING if summary["synthetic"] else CAVEAT
    write_table(partition_rows, out / "table2_partition",
                f"Table 2 style: {summary['partition']} partition, K = {summary['num_clients']} "
                f"({summary['task']})", note)
    final = {m: summary.get(f"test_{m}") for m in METRICS}
    write_table([{"method": METHOD_LABEL[summary["method"]], "arch": summary["arch"], **final}], out / "metrics",
                "Final test metrics", note)
    write_table(summary["per_client"], out / "per_client",
                "Per-client evaluation (client validation sets)" if summary["mode"] != "local"
                else "Local-only models per client (test and own validation set)")
    if summary["accounting"]:
        acc = summary["accounting"]
        write_table(acc["per_client"], out / "accounting",
                    f"DP-SGD accounting: C = {acc['max_grad_norm']}, z = {acc['noise_multiplier']}, "
                    f"delta = {acc['delta']}", f"eps_rdp: {acc['accountant']}. eps_paper_sqrtT: the paper's "
                    "basic-composition estimate sqrt(T) * sqrt(2 ln(1.25/delta)) / z (not a valid bound).")
    if summary["communication"]:
        write_table([summary["communication"]], out / "communication", "Communication per round (Table 4 style)")
    if info["dp_model_changes"]:
        write_table(info["dp_model_changes"], out / "dp_model_changes", "Model changes made for Opacus")
    cm = summary.get("confusion")
    if cm:
        names = summary["class_names"]
        atomic_write_text(out / "confusion_matrix.csv", csv_text(["true\\pred", *names],
                                                                 ([n, *row] for n, row in zip(names, cm)),
                                                                 quote_values=False))
        _confusion_figure(np.asarray(cm), names, out / "confusion_matrix.png", summary["run"])
    if rounds:
        fig, ax = subplots(figsize=(5, 3.2))
        r = [x["round"] for x in rounds]
        ax.plot(r, [100 * x["test_accuracy"] for x in rounds], marker="o", label="test accuracy")
        if "test_f1" in rounds[0]:
            ax.plot(r, [100 * x["test_f1"] for x in rounds], marker=".", label="test macro F1")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(integer_ticks())
        ax.set_ylabel("%")
        ax.set_title(f"{METHOD_LABEL[summary['method']]} {summary['arch']} ({summary['task']})", fontsize=9)
        ax.legend(fontsize=7)
        save_fig(fig, out / "convergence.png")


def _confusion_figure(cm: np.ndarray, names: list[str], path: Path, title: str) -> None:
    fig, ax = subplots(figsize=(3.2 + 0.4 * len(names), 3 + 0.3 * len(names)))
    ax.imshow(cm, cmap="Blues")
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title[:60], fontsize=6)
    save_fig(fig, path)


# ----------------------------------------------------------------------------- over runs
def load_summaries(results_dir: str | Path) -> list[dict]:
    runs = Path(results_dir) / "ultrasound" / "runs"
    return [read_json(p) for p in sorted(runs.glob("*/summary.json"))]


def _scale(s: dict) -> str:
    return (f"{s['dataset']} {s['image_size']}px K{s['num_clients']} T{s['num_rounds']} E{s['local_epochs']}"
            + (" SYNTHETIC" if s["synthetic"] else "")
            # audited runs train client 0 on canaries too: their own rows, never pooled with un-audited seeds
            + (f" audited ({s['audit']['canaries']} {s['audit']['canary_kind']})" if s.get("audit") else "")
            # issue 37: a deliberately broken mechanism never pools with the correct one
            + (f" FAULT {s['dp_fault']}" if s.get("dp_fault") else ""))


def _dp(s: dict) -> str:
    if not s["dp_sgd"]:
        return "none"
    mode = f", {s['dp_finetune']}" if s.get("dp_finetune") else ""  # runs before us-dp-finetune: GroupNorm
    return f"C={s['max_grad_norm']:g}, z={s['noise_multiplier']:g}{mode}"


def _stat_cells(runs: list[dict], scale: float = 100.0) -> dict:
    cells: dict[str, object] = {}  # "<m> (%)": the printed cell; "_<m>": its SeedSummary
    for m in METRICS:
        summ = summarize([None if r.get(f"test_{m}") is None else r[f"test_{m}"] * scale for r in runs])
        cells[f"{m} (%)"] = summ.fmt(2)
        cells[f"_{m}"] = summ
    return cells


TEST_SAMPLING_NOTE = ("with test sampling: mean [95% normal interval] whose variance adds one run's test-set sampling "
                      "variance (binomial for accuracy, the conservative Hanley-McNeil SE for a binary AUC, from the "
                      "kept confusion counts and AUC) to the seeds' variance over k, because every seed tests on the "
                      "same images (flower_apps/ultrasound/sampling_variance.py); '-' for a three-class AUC (its "
                      "per-class AUCs are not kept). The +- SD [t-interval] cells cover training variance only.")


def test_sampling_cells(runs: list[dict], scale: float = 100.0) -> dict:
    """Accuracy and AUC of a cell with the shared test set's sampling error added (TEST_SAMPLING_NOTE)."""
    ses = [run_ses(r) for r in runs]
    out = {}
    for metric, name in (("accuracy", "accuracy with test sampling (%)"), ("auc", "AUC with test sampling (%)")):
        vals = [r.get(f"test_{metric}") for r in runs]
        errs = [s[metric] for s in ses]
        if any(v is None for v in vals) or any(e is None for e in errs):
            out[name] = "-"
            continue
        cell = combine([float(v) * scale for v in vals], [float(e) * scale for e in errs])  # type: ignore[arg-type]
        lo, hi = cell.with_test
        out[name] = f"{cell.mean:.2f} [{lo:.2f}, {hi:.2f}]"
    return out


def _majority_share(summary: dict) -> float:
    """Accuracy (%) of always predicting the test set's most frequent class (from the confusion matrix)."""
    cm = np.asarray(summary["confusion"], dtype=float)
    return float(100.0 * cm.sum(1).max() / cm.sum()) if cm.sum() else math.nan


def _step_ratio(runs: list[dict], base: tuple[float, int] | None) -> str:
    """DP step time over the matching non-DP run's, qualified where it is not DP-SGD's overhead.

    "(head only)": the DP runs train fewer parameters than the non-DP run (``frozen-bn-head``: the
    classifier, every other layer frozen), so the ratio is the recipe's saving, not DP-SGD's cost on the
    same training (that one: ``benchmarks/ultrasound_dpsgd_overhead.py``). "cached trunk": some of them
    trained the classifier on trunk features computed once (``timing.trunk_cached_share``), a step then
    being a classifier step only.
    """
    if not base or not base[0]:
        return "-"
    ratio = float(np.mean([r["timing"]["mean_step_seconds"] for r in runs])) / base[0]
    notes = []
    if any(r.get("num_trainable", base[1]) < base[1] for r in runs):
        notes.append("head only")
    if any(r["timing"].get("trunk_cached_share") for r in runs):
        notes.append("cached trunk")
    return f"{ratio:.2g}x" + (f" ({', '.join(notes)})" if notes else "")


def results_rows(summaries: list[dict], dp: bool) -> list[dict]:
    """Tables 5-10 (dp=False) or 12-14 (dp=True): one row per (scale, task, partition, arch, method, DP)."""
    sel = [s for s in summaries if bool(s["dp_sgd"]) == dp]
    key = lambda s: (_scale(s), s["task"], s["partition"], s["arch"], s["method"], _dp(s))
    order = lambda k: (k[0], k[1], k[2], k[3], METHOD_ORDER.index(k[4]), k[5])
    groups = group_by(sel, key)
    rows = []
    audited = any(s.get("audit") for s in sel)
    nodp_step = {(_scale(s), s["task"], s["partition"], s["arch"], s["method"]):
                 (s["timing"]["mean_step_seconds"], s.get("num_trainable", 0)) for s in summaries if not s["dp_sgd"]}
    for k in sorted(groups, key=order):
        runs = groups[k]
        row = {"scale": k[0], "task": k[1], "partition": k[2], "arch": k[3], "method": METHOD_LABEL[k[4]],
               "seeds": len(runs)}
        if dp:
            row["DP-SGD"] = k[5]
            eps = [r["accounting"]["eps_rdp_max"] for r in runs if r.get("accounting")]
            row["eps RDP (max client)"] = f"{np.mean(eps):.3g}" if eps else "-"
            row["eps paper sqrt(T)"] = f"{np.mean([r['accounting']['eps_paper_sqrtT_max'] for r in runs]):.3g}"
            if audited:
                row.update(audit_cells(runs))
            row["step time vs no-DP"] = _step_ratio(runs, nodp_step.get(k[:5]))
        row.update(_stat_cells(runs))
        row.update(test_sampling_cells(runs))
        row["_majority"] = float(np.mean([_majority_share(r) for r in runs]))
        secs = [r["timing"]["mean_round_seconds"] for r in runs if not np.isnan(r["timing"]["mean_round_seconds"])]
        row["round time (s)"] = f"{np.mean(secs):.2f}" if secs else "-"
        rows.append(row)
    return rows


def summary_rows(rows: list[dict]) -> list[dict]:
    """Table 11: per (scale, task, partition) the best FL row vs the best centralized row (accuracy), delta."""
    out = []
    for key, grp in sorted(group_by(rows, lambda r: (r["scale"], r["task"], r["partition"])).items()):
        fl = [r for r in grp if r["method"] not in ("Centralized", "Local-only")]
        cen = [r for r in grp if r["method"] == "Centralized"]
        if not fl:
            continue
        best_fl = max(fl, key=lambda r: r["_accuracy"].mean)
        row = {"scale": key[0], "task": key[1], "partition": key[2],
               "best FL": f"{best_fl['method']} {best_fl['arch']}", "FL acc (%)": best_fl["accuracy (%)"],
               "FL AUC (%)": best_fl["auc (%)"]}
        if cen:
            best_c = max(cen, key=lambda r: r["_accuracy"].mean)
            row["centralized"] = best_c["arch"]
            row["centralized acc (%)"] = best_c["accuracy (%)"]
            row["centralized AUC (%)"] = best_c["auc (%)"]
            row["delta FL - centralized (pp)"] = f"{best_fl['_accuracy'].mean - best_c['_accuracy'].mean:+.2f}"
        else:
            row.update({"centralized": "-", "centralized acc (%)": "-", "centralized AUC (%)": "-",
                        "delta FL - centralized (pp)": "-"})
        # accuracy is "best" even for a model that predicts one class: show what that would score
        row["majority-class acc (%)"] = f"{best_fl['_majority']:.2f}"
        row["paper (accuracy %)"] = PAPER_REFERENCE.get(key[1], "-")
        out.append(row)
    return out


def ablation_rows(summaries: list[dict]) -> tuple[list[dict], dict]:
    """Table 15: FedAvg + DP-SGD accuracy per (C, z) grid cell (mean +- SD over seeds)."""
    sel = [s for s in summaries if s["dp_sgd"] and s["method"] == "fedavg"]
    groups = group_by(sel, lambda s: (_scale(s), s["task"], s["partition"], s["arch"]))
    rows, grids = [], {}
    for key, runs in sorted(groups.items()):
        cs = sorted({r["max_grad_norm"] for r in runs})
        zs = sorted({r["noise_multiplier"] for r in runs})
        grid = np.full((len(cs), len(zs)), np.nan)
        for i, c in enumerate(cs):
            row = {"scale": key[0], "task": key[1], "partition": key[2], "arch": key[3], "C": c}
            for j, z in enumerate(zs):
                cell = [r["test_accuracy"] * 100 for r in runs
                        if r["max_grad_norm"] == c and r["noise_multiplier"] == z]
                s = summarize(cell) if cell else None
                row[f"z={z:g}"] = s.fmt(1) if s else "-"
                grid[i, j] = s.mean if s else np.nan
            rows.append(row)
        grids[key] = (cs, zs, grid)
    return rows, grids


def communication_rows(summaries: list[dict]) -> list[dict]:
    """Table 4: per backbone and task head, bytes per round = 2 x |theta| x 4 x K."""
    seen = {}
    for s in summaries:
        if s.get("communication"):
            k = (s["arch"], len(s["class_names"]), s["num_clients"], s["num_rounds"], s["dp_sgd"])
            seen[k] = s["communication"]
    rows = []
    for (arch, c, k, t, dp), com in sorted(seen.items()):
        rows.append({"arch": arch, "classes": c, "K": k, "T": t, "DP model": "GroupNorm" if dp else "as built",
                     "params (M)": f"{com['num_params'] / 1e6:.2f}", "MB / round": f"{com['mb_per_round']:.1f}",
                     "total MB": f"{com['total_mb']:.0f}",
                     "actual payload MB / round": f"{com['payload_mb_per_round']:.1f}"})
    return rows


def per_client_rows(summaries: list[dict]) -> list[dict]:
    """Per-client accuracy on the client's validation set: each method's final model(s), mean over seeds."""
    groups = group_by([s for s in summaries if not s["dp_sgd"]],
                    lambda s: (_scale(s), s["task"], s["partition"], s["arch"], s["method"]))
    rows = []
    for (scale, task, part, arch, method), runs in sorted(groups.items()):
        k = runs[0]["num_clients"]
        row = {"scale": scale, "task": task, "partition": part, "arch": arch, "method": METHOD_LABEL[method]}
        for c in range(k):
            vals = [r["per_client"][c].get("accuracy") for r in runs if c < len(r["per_client"])]
            vals = [v * 100 for v in vals if v is not None and not np.isnan(v)]
            row[f"client {c}"] = f"{np.mean(vals):.1f}" if vals else "-"
        rows.append(row)
    return rows


def _curves_figure(summaries: list[dict], out: Path) -> list[Path]:
    paths = []
    groups = group_by(summaries, lambda s: (_scale(s), s["task"], s["partition"], s["arch"]))
    for (scale, task, part, arch), runs in sorted(groups.items()):
        fig, ax = subplots(figsize=(5.5, 3.6))
        by = group_by(runs, lambda s: (s["method"], _dp(s)))
        for (method, dp), rs in sorted(by.items(), key=lambda kv: (METHOD_ORDER.index(kv[0][0]), kv[0][1])):
            t = min(len(r["acc_curve"]) for r in rs)
            if t == 0:
                continue
            arr = np.asarray([r["acc_curve"][:t] for r in rs]) * 100
            x = np.arange(1, t + 1)
            label = METHOD_LABEL[method] + ("" if dp == "none" else f" DP {dp}")
            (line,) = ax.plot(x, arr.mean(0), lw=1.2, label=label)
            if len(rs) > 1:
                ss = [summarize(list(arr[:, i])) for i in range(t)]
                ax.fill_between(x, [s.ci_low for s in ss], [s.ci_high for s in ss], color=line.get_color(), alpha=0.15)
        ax.set_xlabel("round (centralized / local: round-equivalent of E epochs)", fontsize=7)
        ax.xaxis.set_major_locator(integer_ticks())
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{task}, {part}, {arch}\n{scale} (bands: 95% t-interval)", fontsize=8)
        ax.legend(fontsize=6)
        name = f"figure_convergence_{task}_{part}_{arch}_{scale.replace(' ', '_')}.png"
        save_fig(fig, out / name)
        paths.append(out / name)
    return paths


def _ablation_figure(grids: dict, out: Path) -> None:
    for (scale, task, part, arch), (cs, zs, grid) in grids.items():
        if grid.size < 2:
            continue
        fig, ax = subplots(figsize=(1.2 + 0.9 * len(zs), 1.2 + 0.7 * len(cs)))
        im = ax.imshow(grid, cmap="viridis", aspect="auto")
        for i in range(len(cs)):
            for j in range(len(zs)):
                ax.text(j, i, "-" if np.isnan(grid[i, j]) else f"{grid[i, j]:.1f}", ha="center", va="center",
                        color="w", fontsize=8)
        ax.set_xticks(range(len(zs)), [f"{z:g}" for z in zs])
        ax.set_yticks(range(len(cs)), [f"{c:g}" for c in cs])
        ax.set_xlabel("noise multiplier z")
        ax.set_ylabel("clip norm C")
        ax.set_title(f"FedAvg + DP-SGD accuracy (%)\n{task}, {part}, {arch}", fontsize=8)
        fig.colorbar(im, ax=ax)
        save_fig(fig, out / f"figure_ablation_{task}_{part}_{arch}_{scale.replace(' ', '_')}.png")


def _partition_tables(results_dir: Path, summaries: list[dict]) -> str:
    md = "### Table 2 style: client partitions (first seed of each setting)\n\n"
    done = set()
    for s in sorted(summaries, key=lambda s: s["seed"]):
        k = (s["dataset"], s["task"], s["partition"], s["num_clients"])
        p = results_dir / "ultrasound" / "runs" / s["run"] / "table2_partition.md"
        if k in done or not p.is_file():
            continue
        done.add(k)
        md += f"#### {s['task']} / {s['partition']} (seed {s['seed']}, {s['dataset']})\n\n"
        md += p.read_text().split("\n", 2)[2].split("\n\n")[0] + "\n\n"
    return md


def write_report(results_dir: str | Path) -> str:
    """Rebuild every cross-run table and figure under ``<results>/ultrasound``; returns the Markdown."""
    results_dir = Path(results_dir)
    summaries = load_summaries(results_dir)
    if not summaries:
        raise FileNotFoundError(f"no finished ultrasound runs under {results_dir / 'ultrasound' / 'runs'}")
    out = results_dir / "ultrasound"
    synthetic = any(s["synthetic"] for s in summaries)
    head = (SYNTHETIC_WARNING + "\n\n" if synthetic else "") + CAVEAT + "\n\n"
    md = head + _partition_tables(results_dir, summaries)
    res = results_rows(summaries, dp=False)
    if res:
        md += write_table(res, out / "table5_10_results", "Tables 5-10 style: test metrics (mean +- SD [95% t-CI])",
                          TEST_SAMPLING_NOTE + " " + CAVEAT) + "\n"
        md += write_table(summary_rows(res), out / "table11_summary", "Table 11 style: best FL vs centralized",
                          CAVEAT) + "\n"
        md += write_table(per_client_rows(summaries), out / "table_per_client",
                          "Per-client validation accuracy (%) of the final model(s)") + "\n"
    dp = results_rows(summaries, dp=True)
    if dp:
        md += write_table(dp, out / "table12_14_dp", "Tables 12-14 style: DP-SGD (client side, Opacus)",
                          "eps RDP: dp-accounting RDP accountant with each client's actual sample rate and steps; "
                          "eps paper sqrt(T): the paper's basic-composition estimate. " + STEP_NOTE + " " + TEST_SAMPLING_NOTE
                          + " " + CAVEAT)
        md += "\n"
        aud = audit_rows(summaries)
        if aud:
            md += write_table(aud, out / "table_audit", "Empirical DP-SGD audit (one run, example level)",
                              AUDIT_NOTE) + "\n"
        abl, grids = ablation_rows(summaries)
        if abl:
            md += write_table(abl, out / "table15_ablation", "Table 15 style: clip norm C x noise multiplier z "
                              "(FedAvg + DP-SGD accuracy %)") + "\n"
            _ablation_figure(grids, out)
    md += write_paper_tables(res, dp, summaries, out, write_table, CAVEAT, STEP_NOTE)
    com = communication_rows(summaries)
    if com:
        md += write_table(com, out / "table4_communication", "Table 4 style: communication per round "
                          "(2 x |theta| x 4 bytes x K)") + "\n"
    _curves_figure(summaries, out)
    notes = sorted({n for s in summaries for n in s.get("data_notes", [])})
    weights = sorted({f"{s['arch']}: {s['weights']}" for s in summaries})
    md += "\nData: " + "; ".join(notes) + "\n\nWeights: " + "; ".join(weights) + "\n"
    atomic_write_text(out / "report.md", md)
    return md
