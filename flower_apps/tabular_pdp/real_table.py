"""Anonymization report on a real table that lacks some columns (the 50,000-row partial file).

The shared ``global_cancer_patients_2015_2024.partial50k.csv`` holds every record of the public
table but not Patient_ID, Year, Air_Pollution, Alcohol_Use or Smoking. The study's runs use
the generator (all 15 columns); this report runs the same per-client anonymization (anjana
search, element-wise maximum, suppression, pycanon metrics) on the real records with the
quasi-identifiers that are present (Age, Gender, Cancer_Type), so the two can be compared.
No Flower messages: it is a check of the data, not of the federation.

    python -m flower_apps.tabular_pdp.real_table ../shared/data/cancer/global_cancer_patients_2015_2024.partial50k.csv
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from datasets.cancer import COLUMNS, PARTIAL_FILE_MISSING, TARGET, load_cancer_csv
from flower_apps.common.results import atomic_write_json
from flower_apps.common.tables import write_table
from privacy.anonymization import QUASI_IDENTIFIERS, apply_levels, harmonize_levels, privacy_metrics, search_levels


def partial_table_report(path: str | Path, k: int = 5, suppression: float = 0.1,
                         regions: Sequence[str] | None = None) -> dict:
    """Per-region anonymization of a CSV missing the partial file's columns (all other columns checked)."""
    df = load_cancer_csv(path, required=[c for c in COLUMNS if c not in PARTIAL_FILE_MISSING])
    qi = [q for q in QUASI_IDENTIFIERS if q in df.columns]
    names = sorted(df["Country_Region"].unique()) if regions is None else list(regions)
    own = {r: search_levels(df[df["Country_Region"] == r], k, suppression, qi, ident=[]) for r in names}
    levels = harmonize_levels([o.levels for o in own.values()], qi)
    rows = []
    for r in names:
        anon, suppressed = apply_levels(df[df["Country_Region"] == r], levels, k, qi, ident=[])
        m = privacy_metrics(anon.assign(sa=anon[TARGET]), "sa", qi)
        rows.append({"region": r, "own levels": list(own[r].levels), "suppressed": suppressed,
                     "records": m["n_records"], "classes": m["n_classes"], "k": m["k"], "l": m["l"],
                     "t": round(m["t"], 4), "ARIREC": round(m["arirec"], 4)})
    return {"path": str(path), "quasi_identifiers": qi, "levels": list(levels), "k": k, "suppression": suppression,
            "missing_columns": [c for c in PARTIAL_FILE_MISSING if c not in df.columns], "rows": rows}


def write_partial_report(report: dict, out: Path) -> str:
    """real_partial_anonymization.{json,csv,md} under ``out``."""
    atomic_write_json(out / "real_partial_anonymization.json", report)
    note = (f"Real records of {report['path']} (columns absent: {', '.join(report['missing_columns'])}); "
            f"quasi-identifiers {report['quasi_identifiers']}, harmonized levels {report['levels']}, "
            f"k={report['k']}, suppression <= {report['suppression']:.0%}. Without Year the classes are coarser, "
            "so ARIREC is lower than on the full 15-column table.")
    return write_table(report["rows"], out / "real_partial_anonymization",
                       "Anonymization on the real 50,000-row partial file", note)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flower_apps.tabular_pdp.real_table", description=__doc__.split("\n")[0])
    p.add_argument("csv")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--suppression", type=float, default=0.1)
    a = p.parse_args(argv)
    print(write_partial_report(partial_table_report(a.csv, a.k, a.suppression),
                               Path(a.results_dir) / "tabular-pdp"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
