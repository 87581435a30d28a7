"""The ultrasound parts of docs/ultrasound.md generated from the kept 160 px grid (``python -m flower_apps.report --check``).

Data: ``results_us_cpu/ultrasound/runs/*/summary.json`` (the ``cpu`` grid, 3 seeds per cell). Rendered: the
non-DP normal-vs-abnormal (IID) cell of each method with two intervals, over seeds (training only) and with
the shared test set's sampling error added (:mod:`flower_apps.ultrasound.sampling_variance`), and whether the
issue's AUC target (0.90) holds on the mean and on the interval. See :mod:`flower_apps.common.doc_blocks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flower_apps.common.results import read_json
from flower_apps.ultrasound.report import results_rows
from flower_apps.ultrasound.sampling_variance import combine, run_ses

GRID = Path("results_us_cpu") / "ultrasound" / "runs"
CELL = "normal-vs-abnormal_iid_efficientnet_lite0_{method}_nodp_160px_K8_T10_E3_busi_s*"
METHODS = ("fedavg", "fedprox", "fedadam", "centralized")
AUC_TARGET = 0.90  # the target for normal vs abnormal


def _cell(root: Path, method: str) -> list[dict[str, Any]]:
    runs = [read_json(p / "summary.json") for p in sorted((root / GRID).glob(CELL.format(method=method)))
            if (p / "summary.json").is_file()]
    if not runs:
        raise FileNotFoundError(f"no kept run of {CELL.format(method=method)} under {GRID}")
    return sorted(runs, key=lambda s: s["seed"])


def target_values(root: Path) -> Mapping[str, str]:
    """Per method: mean test AUC, both 95% intervals, one run's test-sampling SE, the verdict on the target."""
    out = {"target": f"{AUC_TARGET:.2f}"}
    for method in METHODS:
        runs = _cell(root, method)
        aucs = [float(s["test_auc"]) for s in runs]
        ses = [run_ses(s)["auc"] for s in runs]
        if any(se is None for se in ses):
            raise ValueError(f"{method}: a binary run without a test-sampling SE")
        cell = combine(aucs, [float(se) for se in ses if se is not None])
        lo_t, hi_t = cell.training
        lo, hi = cell.with_test
        out[f"{method}.mean"] = f"{cell.mean:.3f}"
        out[f"{method}.training"] = f"[{lo_t:.3f}, {hi_t:.3f}]"
        out[f"{method}.with_test"] = f"[{lo:.3f}, {hi:.3f}]"
        out[f"{method}.test_se"] = f"{cell.test_se:.3f}"
        out[f"{method}.verdict"] = ("met with confidence" if lo >= AUC_TARGET else
                                    "met on the mean only" if cell.mean >= AUC_TARGET else "not met")
    return out


TASK_LABEL = {"benign-vs-malignant": "benign vs malignant", "normal-vs-abnormal": "normal vs abnormal",
              "three-class": "three classes"}
SCALE = "busi 160px K8 T10 E3"  # the kept cpu grid's scale label (flower_apps.ultrasound.report)


def nodp_table(root: Path) -> str:
    """docs/ultrasound.md's Tables 5-10 (no DP-SGD): the kept grid's cells through the sweep report's own rows
    (flower_apps.ultrasound.report.results_rows), with the intervals that add the test set's sampling error."""
    summaries = [read_json(p) for p in sorted((root / GRID).glob("*/summary.json"))]
    rows = [r for r in results_rows(summaries, dp=False) if r["scale"] == SCALE and r["arch"] == "efficientnet_lite0"]
    if not rows:
        raise FileNotFoundError(f"no kept non-DP run of the cpu grid ({SCALE}) under {GRID}")
    head = ["task", "partition", "method", "seeds", "accuracy (%)", "macro F1 (%)", "ROC-AUC (%)", "majority (%)",
            "accuracy with test sampling (%)", "ROC-AUC with test sampling (%)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["task"], r["partition"])):  # stable: the report's method order stays
        lines.append("| " + " | ".join([TASK_LABEL[r["task"]], r["partition"], r["method"], str(r["seeds"]),
                                        r["accuracy (%)"], r["f1 (%)"], r["auc (%)"], f"{r['_majority']:.2f}",
                                        r["accuracy with test sampling (%)"], r["AUC with test sampling (%)"]]) + " |")
    return "\n".join(lines)


BLOCKS = {"ultrasound-nodp-table": nodp_table}
VALUES = {"ultrasound-target": target_values}


TASK_ORDER = ("normal-vs-abnormal", "benign-vs-malignant", "three-class")


def _signed(x: float) -> str:
    return f"{x:+.2f}"


def dp_table(root: Path) -> str:
    """docs/ultrasound.md's DP-SGD table (Tables 12-14 at the grid's recipe) beside each cell's non-DP run:
    the sweep report's own rows (flower_apps.ultrasound.report.results_rows) of the kept grid, the DP cost
    being the non-DP mean minus the DP mean (points)."""
    summaries = [read_json(p) for p in sorted((root / GRID).glob("*/summary.json"))]

    def ours(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r["scale"] == SCALE and r["arch"] == "efficientnet_lite0"]

    dp, nodp = ours(results_rows(summaries, dp=True)), ours(results_rows(summaries, dp=False))
    if not dp:
        raise FileNotFoundError(f"no kept DP-SGD run of the cpu grid ({SCALE}) under {GRID}")
    base = {(r["task"], r["partition"], r["method"]): r for r in nodp}
    head = ["task", "partition", "method", "seeds", "accuracy (%)", "macro F1 (%)", "ROC-AUC (%)", "majority (%)",
            "no-DP accuracy / AUC (%) [seeds]", "DP cost, accuracy / AUC (pp)", "eps per client: RDP (paper sqrt(T))"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(dp, key=lambda r: (TASK_ORDER.index(r["task"]), r["partition"])):  # the report's method order stays
        b = base.get((r["task"], r["partition"], r["method"]))
        if b is None:
            no_dp, cost = "not run", "-"
        else:
            no_dp = f"{b['accuracy (%)']} / {b['auc (%)']} [{b['seeds']}]"
            cost = (f"{_signed(b['_accuracy'].mean - r['_accuracy'].mean)} / "
                    f"{_signed(b['_auc'].mean - r['_auc'].mean)}")
        lines.append("| " + " | ".join([TASK_LABEL[r["task"]], r["partition"], r["method"], str(r["seeds"]),
                                        r["accuracy (%)"], r["f1 (%)"], r["auc (%)"], f"{r['_majority']:.2f}",
                                        no_dp, cost, f"{r['eps RDP (max client)']} ({r['eps paper sqrt(T)']})"]) + " |")
    return "\n".join(lines)


BLOCKS["ultrasound-dp-table"] = dp_table


PAPER_QUOTES = Path("results_paper") / "ultrasound" / "paper_quotes.json"


def _span(vals: list[float]) -> str:
    lo, hi = min(vals), max(vals)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def paper_table(root: Path) -> str:
    """docs/ultrasound.md's "Beside the paper's numbers": each quoted setting's cells of the kept grid (one
    method: mean [95% t-interval]; several: the span of their means) beside the paper's quoted accuracy
    (``results_paper/ultrasound/paper_quotes.json``)."""
    summaries = [read_json(p) for p in sorted((root / GRID).glob("*/summary.json"))]
    rows = {dp: [r for r in results_rows(summaries, dp=dp) if r["scale"] == SCALE and r["arch"] == "efficientnet_lite0"]
            for dp in (False, True)}
    head = ["task", "setting", "this grid: accuracy (%) [95% interval]", "this grid: ROC-AUC (%)", "majority class (%)",
            "paper: accuracy (%)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for q in read_json(root / PAPER_QUOTES)["rows"]:
        cells = [r for r in rows[q["dp"]] if r["task"] == q["task"] and r["partition"] == q["partition"]
                 and r["method"] in q["methods"]]
        if len(cells) != len(q["methods"]):
            raise FileNotFoundError(f"{q['task']} / {q['setting']}: {len(cells)} of {len(q['methods'])} cells kept")
        seeds = sorted({c["seeds"] for c in cells})
        seed_text = f"{'/'.join(map(str, seeds))} seeds"
        if len(cells) == 1:
            c = cells[0]
            acc = f"{c['_accuracy'].mean:.2f} [{c['_accuracy'].ci_low:.2f}, {c['_accuracy'].ci_high:.2f}] ({seed_text})"
            auc = f"{c['_auc'].mean:.2f} [{c['_auc'].ci_low:.2f}, {c['_auc'].ci_high:.2f}]"
        else:
            acc = f"{_span([c['_accuracy'].mean for c in cells])} (means; {seed_text})"
            auc = _span([c["_auc"].mean for c in cells])
        lines.append("| " + " | ".join([TASK_LABEL[q["task"]], q["setting"], acc, auc,
                                        f"{cells[0]['_majority']:.2f}", q["paper"]]) + " |")
    return "\n".join(lines)


BLOCKS["ultrasound-paper-table"] = paper_table


def _range(vals: list[float], fmt: str) -> str:
    lo, hi = fmt.format(min(vals)), fmt.format(max(vals))
    return lo if lo == hi else f"{lo}-{hi}"


def dp_values(root: Path) -> Mapping[str, str]:
    """The prose numbers about the grid's DP-SGD runs: the epsilon ranges (RDP and the paper's sqrt(T) formula,
    worst client per run) and, on normal vs abnormal, the per-run AUC range, the run count and the accuracy that
    every one of those runs scores (the always-abnormal rate, when they all predict one class)."""
    runs = [s for s in (read_json(p) for p in sorted((root / GRID).glob("*/summary.json")))
            if s.get("dp_sgd") and s.get("arch") == "efficientnet_lite0" and s.get("image_size") == 160]
    if not runs:
        raise FileNotFoundError(f"no kept DP-SGD run of the cpu grid under {GRID}")
    nva = [s for s in runs if s["task"] == "normal-vs-abnormal"]
    accs = {f"{100 * s['test_accuracy']:.2f}" for s in nva}
    specs = {float(s["test_specificity"]) for s in nva}
    return {
        "eps_rdp": _range([s["accounting"]["eps_rdp_max"] for s in runs], "{:.3g}"),
        "eps_paper": _range([s["accounting"]["eps_paper_sqrtT_max"] for s in runs], "{:.3g}"),
        "nva.auc": _range([s["test_auc"] for s in nva], "{:.2f}"),
        "nva.runs": str(len(nva)),
        "nva.accuracy": accs.pop() if len(accs) == 1 else "varies",
        "nva.specificity": f"{specs.pop():g}" if len(specs) == 1 else "varies",
    }


VALUES["ultrasound-dp"] = dp_values
