"""The "Global Cancer Patients 2015-2024" table: schema, CSV loader and a schema-faithful generator.

The public table (Kaggle, Zahid Feroze; synthetic) has 50,000 rows and 15 columns. The
project ships no copy of it: users point ``load_cancer_csv`` at their file, and the
generator below produces a table with the same schema and distributions when no CSV is
available (it is the embedded default).

How the generator's constants were obtained (by reading, not copying, the 1,000-record
public sample ``../shared/data/cancer/global_cancer_patients_2015_2024.sample1000.csv``,
which in fact holds 1,001 records, PT0000000-PT0001000):

* every input column is independent of the others (|Pearson r| <= 0.09 on the sample);
* Age: integers uniform on 20..89 (sample min 20, max 89; KS vs uniform p = 0.48);
* Gender: Female / Male / Other, equiprobable (353 / 338 / 310; chi-square p = 0.24);
* Year: integers uniform on 2015..2024 (87..115 per year);
* Genetic_Risk, Air_Pollution, Alcohol_Use, Smoking, Obesity_Level, Survival_Years:
  uniform on [0, 10] rounded to 0.1 (KS p between 0.07 and 0.70);
* Treatment_Cost_USD: uniform on [5,000, 100,000] rounded to cents (min 5,087.64, max 99,996.61, KS p = 0.56);
* Cancer_Type: 8 types, equiprobable (111..137 each); Cancer_Stage: Stage 0..IV, equiprobable;
* Target_Severity_Score = round(0.2 Genetic_Risk + 0.15 Air_Pollution + 0.15 Alcohol_Use
  + 0.2 Smoking + 0.1 Obesity_Level - 2e-5 Treatment_Cost_USD + 2.0, 2). This reproduces
  all 1,001 sample scores exactly. The shared README quotes the five risk-factor coefficients
  and "about 1.94" without the cost term; without it the least-squares residual SD is 0.54,
  with it 0.003 (rounding only);
* Country_Region: the public table's per-country counts (shared README, identical in the
  50,000-row partial file), shuffled.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import DataError, DatasetUnavailableError, check_data_dir, one_line

COUNTRY_COUNTS: dict[str, int] = {
    "Australia": 5092, "Brazil": 5004, "Canada": 4864, "China": 4913, "Germany": 5024,
    "India": 5040, "Pakistan": 4926, "Russia": 5017, "UK": 5060, "USA": 5060,
}
GENDERS = ("Female", "Male", "Other")
CANCER_TYPES = ("Breast", "Cervical", "Colon", "Leukemia", "Liver", "Lung", "Prostate", "Skin")
CANCER_STAGES = ("Stage 0", "Stage I", "Stage II", "Stage III", "Stage IV")
RISK_FACTORS = ("Genetic_Risk", "Air_Pollution", "Alcohol_Use", "Smoking", "Obesity_Level")
TARGET = "Target_Severity_Score"
IDENTIFIER = "Patient_ID"
AGE_RANGE = (20, 89)
YEAR_RANGE = (2015, 2024)
COST_RANGE = (5000.0, 100000.0)
# Fitted on the sample (see module docstring): exact up to the 2-decimal rounding.
SEVERITY_COEFFICIENTS: dict[str, float] = {
    "Genetic_Risk": 0.2, "Air_Pollution": 0.15, "Alcohol_Use": 0.15, "Smoking": 0.2, "Obesity_Level": 0.1,
    "Treatment_Cost_USD": -2e-5,
}
SEVERITY_INTERCEPT = 2.0
GENERATOR_SEED = 2015  # one fixed table, like the paper's single dataset; run seeds vary splits and training

# Column -> kind: "id" (string), "int", "float", or a tuple of allowed categories ("str" = any string).
SCHEMA: dict[str, object] = {
    "Patient_ID": "id", "Age": "int", "Gender": GENDERS, "Country_Region": "str", "Year": "int",
    "Genetic_Risk": "float", "Air_Pollution": "float", "Alcohol_Use": "float", "Smoking": "float",
    "Obesity_Level": "float", "Cancer_Type": CANCER_TYPES, "Cancer_Stage": CANCER_STAGES,
    "Treatment_Cost_USD": "float", "Survival_Years": "float", TARGET: "float",
}
COLUMNS = tuple(SCHEMA)
# Columns absent from the 50,000-row partial file in ../shared (for the optional real-data report).
PARTIAL_FILE_MISSING = ("Patient_ID", "Year", "Air_Pollution", "Alcohol_Use", "Smoking")
DEFAULT_CSV_NAME = "global_cancer_patients_2015_2024.csv"
SOURCES = ("cancer-synthetic", "cancer-csv")


class CancerSchemaError(DataError):
    """A cancer table that does not match the schema; the message names the file and the column."""


def severity_score(df: pd.DataFrame) -> np.ndarray:
    """The table's target as a function of its columns (unrounded)."""
    return SEVERITY_INTERCEPT + sum(c * df[k].to_numpy(dtype=float) for k, c in SEVERITY_COEFFICIENTS.items())


def generate_cancer_table(seed: int = GENERATOR_SEED, country_counts: dict[str, int] | None = None) -> pd.DataFrame:
    """A table with the public schema and the distributions fitted on the sample (module docstring).

    Parameters
    ----------
    seed : seed of the ``np.random.Generator`` (same seed, same table).
    country_counts : rows per Country_Region (default: the public table's, 50,000 rows).
    """
    counts = dict(COUNTRY_COUNTS if country_counts is None else country_counts)
    if any(int(v) < 0 for v in counts.values()):
        raise ValueError(f"country_counts must be >= 0, got {counts}")
    rng = np.random.default_rng(seed)
    n = int(sum(counts.values()))
    countries = np.repeat(np.array(list(counts), dtype=object), [int(v) for v in counts.values()])
    rng.shuffle(countries)

    def unit(decimals: int, lo: float, hi: float) -> np.ndarray:
        return np.round(rng.uniform(lo, hi, n), decimals)

    df = pd.DataFrame({
        "Patient_ID": [f"PT{i:07d}" for i in range(n)],
        "Age": rng.integers(AGE_RANGE[0], AGE_RANGE[1] + 1, n),
        "Gender": rng.choice(np.array(GENDERS, dtype=object), n),
        "Country_Region": countries,
        "Year": rng.integers(YEAR_RANGE[0], YEAR_RANGE[1] + 1, n),
        **{k: unit(1, 0.0, 10.0) for k in RISK_FACTORS},
        "Cancer_Type": rng.choice(np.array(CANCER_TYPES, dtype=object), n),
        "Cancer_Stage": rng.choice(np.array(CANCER_STAGES, dtype=object), n),
        "Treatment_Cost_USD": unit(2, *COST_RANGE),
        "Survival_Years": unit(1, 0.0, 10.0),
    })
    df[TARGET] = np.round(severity_score(df), 2)
    return df[list(COLUMNS)]


def validate_cancer_table(df: pd.DataFrame, required: Iterable[str] = COLUMNS, source: str = "table") -> pd.DataFrame:
    """Check columns and types; return a copy with canonical dtypes.

    Raises :class:`CancerSchemaError` naming the first missing or ill-typed column (all
    missing columns are listed together).
    """
    required = list(required)
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise CancerSchemaError(f"{source}: missing column(s) {', '.join(missing)}; expected the 15 columns "
                                f"{', '.join(COLUMNS)}")
    if len(df) == 0:
        raise CancerSchemaError(f"{source}: no rows")
    out = pd.DataFrame(index=pd.RangeIndex(len(df)))
    for col in required:
        kind = SCHEMA[col]
        s = df[col].reset_index(drop=True)
        if s.isna().any():
            row = int(np.flatnonzero(s.isna().to_numpy())[0])
            raise CancerSchemaError(f"{source}: column {col} has an empty value (data row {row + 1})")
        if kind in ("int", "float"):
            num = pd.to_numeric(s, errors="coerce")
            if num.isna().any():
                row = int(np.flatnonzero(num.isna().to_numpy())[0])
                raise CancerSchemaError(f"{source}: column {col} must be numeric ({kind}), got {s.iloc[row]!r} "
                                        f"(data row {row + 1})")
            if kind == "int":
                if not np.all(np.equal(np.mod(num.to_numpy(dtype=float), 1), 0)):
                    row = int(np.flatnonzero(np.mod(num.to_numpy(dtype=float), 1) != 0)[0])
                    raise CancerSchemaError(f"{source}: column {col} must hold integers, got {s.iloc[row]!r} "
                                            f"(data row {row + 1})")
                out[col] = num.astype(np.int64)
            else:
                out[col] = num.astype(float)
        else:
            s = s.astype(str).str.strip()
            if (s == "").any():
                raise CancerSchemaError(f"{source}: column {col} has an empty value")
            if isinstance(kind, tuple):
                bad = sorted(set(s) - set(kind))
                if bad:
                    raise CancerSchemaError(f"{source}: column {col} has unknown value(s) {bad[:5]}; "
                                            f"allowed: {list(kind)}")
            out[col] = s.astype(object)
    for col, lo, hi in (("Age", 0, 120), *((k, 0.0, 10.0) for k in RISK_FACTORS)):
        if col in out and not out[col].between(lo, hi).all():
            raise CancerSchemaError(f"{source}: column {col} must lie in [{lo}, {hi}], "
                                    f"got {out[col].min()}..{out[col].max()}")
    return out


def load_cancer_csv(path: str | Path, required: Iterable[str] = COLUMNS) -> pd.DataFrame:
    """Read and validate a CSV of the table (a folder means ``<folder>/global_cancer_patients_2015_2024.csv``).

    Every failure is a :class:`DataError` with a one-line message naming the file (and the
    column, for schema errors); a path that does not exist says so.
    """
    p = check_data_dir(path, f"the cancer CSV file or a folder holding {DEFAULT_CSV_NAME}")
    if p is None:
        raise DatasetUnavailableError("the cancer CSV needs a path: set data-dir to the CSV file or its folder")
    if p.is_dir():
        p = p / DEFAULT_CSV_NAME
    if not p.is_file():
        raise DatasetUnavailableError(f"cancer CSV not found: {p} (set data-dir to the CSV file or its folder)")
    try:
        df = pd.read_csv(p, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        raise CancerSchemaError(f"{p}: not a readable CSV ({one_line(exc)})") from exc
    return validate_cancer_table(df, required, source=str(p))


def describe_source(source: str, data_dir: str = "") -> str:
    """One line saying what a source is (for result files)."""
    if source == "cancer-synthetic":
        return (f"synthetic table from datasets.cancer.generate_cancer_table (seed {GENERATOR_SEED}, "
                f"{sum(COUNTRY_COUNTS.values()):,} rows, the public table's per-country counts)")
    return f"CSV {data_dir}"


def load_cancer(source: str, data_dir: str = "") -> tuple[pd.DataFrame, list[str]]:
    """(table, notes) for a source name: 'cancer-synthetic' (generator) or 'cancer-csv' (``data_dir``)."""
    if source == "cancer-synthetic":
        return generate_cancer_table(), [describe_source(source)]
    if source == "cancer-csv":
        if not data_dir:
            raise DatasetUnavailableError("dataset 'cancer-csv' needs data-dir = the CSV file or its folder")
        return load_cancer_csv(data_dir), [describe_source(source, data_dir)]
    raise DataError(f"unknown cancer source {source!r}; allowed: {list(SOURCES)}")
