"""The kept reduced-scale tables of unlinkable-dfl (results_reduced/unlinkable-dfl/<experiment>-reduced*/) are what
``--report-only`` builds from the kept run folders and transport measurements beside them: docs/unlinkable_dfl.md's
generated tables (flower_apps.unlinkable_dfl.docs) read those files, so a table that drifted from its data fails."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flower_apps.unlinkable_dfl import sweep

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "results_reduced" / "unlinkable-dfl"
FASHION = Path("/usr/share/datasets/fashion-mnist")
CASES = [(e, [], f"{e}-reduced", 3 if e == "linking" else 1)
         for e in ("scaling", "cost", "payload", "partial", "churn", "byzantine", "topology", "content", "linking")]
CASES += [(e, ["--dataset", "fashion-mnist", "--data-fraction", "0.0667"], f"{e}-reduced-fashion-mnist", 1)
          for e in ("payload", "partial")]
CASES += [("linking", ["--scale", "paper"], "linking-paper", 1)]


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kept")
    for part in ("runs", "transport"):
        shutil.copytree(KEPT / part, root / "unlinkable-dfl" / part)
    return root


@pytest.mark.parametrize("experiment, flags, folder, seeds", CASES, ids=[c[2] for c in CASES])
def test_report_only_rebuilds_the_kept_tables(rebuilt: Path, experiment, flags, folder, seeds):
    if "fashion-mnist" in flags and not FASHION.is_dir():
        pytest.skip(f"Fashion-MNIST not at {FASHION} (--dataset checks it before reporting)")
    kept = sorted((KEPT / folder).glob("*.csv"))
    assert kept, f"no kept tables in {folder}"
    assert sweep.main(["--experiment", experiment, "--seeds", str(seeds), "--results-dir", str(rebuilt),
                       "--report-only", *flags]) == 0
    for table in kept:
        got = rebuilt / "unlinkable-dfl" / folder / table.name
        assert got.read_text() == table.read_text(), f"{folder}/{table.name} differs from what its kept data gives"
