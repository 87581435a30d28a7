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
