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


BLOCKS: dict = {}
VALUES = {"ultrasound-target": target_values}
