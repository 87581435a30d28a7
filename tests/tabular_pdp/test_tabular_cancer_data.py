"""The cancer table: loader errors, generator schema and formula, generator vs the public sample."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from datasets.cancer import (
    CANCER_STAGES,
    CANCER_TYPES,
    COLUMNS,
    COUNTRY_COUNTS,
    GENDERS,
    RISK_FACTORS,
    TARGET,
    CancerSchemaError,
    generate_cancer_table,
    load_cancer_csv,
    severity_score,
    validate_cancer_table,
)

CANCER_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "cancer"  # as tests/conftest.py
SAMPLE = CANCER_DIR / "global_cancer_patients_2015_2024.sample1000.csv"
PARTIAL = CANCER_DIR / "global_cancer_patients_2015_2024.partial50k.csv"


@pytest.fixture(scope="module")
def small_table() -> pd.DataFrame:
    return generate_cancer_table(seed=1, country_counts={"UK": 30, "USA": 20})


def _csv(tmp_path, df: pd.DataFrame, name="t.csv"):
    p = tmp_path / name
    df.to_csv(p, index=False)
    return p


def test_generator_has_the_schema_the_counts_and_is_reproducible(small_table):
    assert tuple(small_table.columns) == COLUMNS
    assert small_table["Country_Region"].value_counts().to_dict() == {"UK": 30, "USA": 20}
    validate_cancer_table(small_table)  # no error
    again = generate_cancer_table(seed=1, country_counts={"UK": 30, "USA": 20})
    pd.testing.assert_frame_equal(small_table, again)
    assert not generate_cancer_table(seed=2, country_counts={"UK": 30, "USA": 20}).equals(small_table)


def test_default_generator_has_the_public_per_country_counts():
    df = generate_cancer_table()
    assert len(df) == 50_000
    assert df["Country_Region"].value_counts().to_dict() == COUNTRY_COUNTS


def test_generated_target_is_the_fitted_linear_formula(small_table):
    # hand check on one row: 0.2 G + 0.15 AP + 0.15 AU + 0.2 S + 0.1 O - 2e-5 cost + 2
    r = small_table.iloc[0]
    hand = (0.2 * r.Genetic_Risk + 0.15 * r.Air_Pollution + 0.15 * r.Alcohol_Use + 0.2 * r.Smoking
            + 0.1 * r.Obesity_Level - 2e-5 * r.Treatment_Cost_USD + 2.0)
    assert r[TARGET] == pytest.approx(round(hand, 2), abs=1e-9)
    assert np.abs(severity_score(small_table) - small_table[TARGET]).max() <= 0.005 + 1e-9


def test_loader_reads_a_valid_csv(tmp_path, small_table):
    df = load_cancer_csv(_csv(tmp_path, small_table))
    assert len(df) == 50 and df["Age"].dtype == np.int64 and df[TARGET].dtype == float


def test_missing_columns_are_named(tmp_path, small_table):
    with pytest.raises(CancerSchemaError, match="missing column.*Smoking"):
        load_cancer_csv(_csv(tmp_path, small_table.drop(columns=["Smoking"])))


@pytest.mark.parametrize("col,value,match", [
    ("Age", "forty", "column Age must be numeric"),
    ("Age", 40.5, "column Age must hold integers"),
    ("Genetic_Risk", 12.0, r"column Genetic_Risk must lie in \[0.0, 10.0\]"),
    ("Cancer_Stage", "Stage V", "column Cancer_Stage has unknown value"),
    ("Gender", "", "column Gender has an empty value"),
    (TARGET, "high", f"column {TARGET} must be numeric"),
])
def test_ill_typed_columns_are_named(tmp_path, small_table, col, value, match):
    bad = small_table.astype({col: object}).copy()
    bad.loc[3, col] = value
    with pytest.raises(CancerSchemaError, match=match):
        load_cancer_csv(_csv(tmp_path, bad))


def test_malformed_and_missing_files_fail_clearly(tmp_path, small_table):
    p = tmp_path / "broken.csv"
    p.write_text(",".join(COLUMNS) + '\nPT1,40,"Male,UK\n' + "x," * 30 + "\n")
    with pytest.raises(CancerSchemaError, match="not a readable CSV"):
        load_cancer_csv(p)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text(",".join(COLUMNS) + "\n1,2,3\n" + ",".join(["1"] * 20) + "\n")
    with pytest.raises(CancerSchemaError, match="not a readable CSV"):
        load_cancer_csv(ragged)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(CancerSchemaError, match="not a readable CSV"):
        load_cancer_csv(empty)
    with pytest.raises(FileNotFoundError, match="data-dir"):
        load_cancer_csv(tmp_path / "nope.csv")


@pytest.mark.shared
def test_partial_shared_file_is_refused_naming_its_missing_columns():
    with pytest.raises(CancerSchemaError) as err:
        load_cancer_csv(PARTIAL)
    for col in ("Patient_ID", "Year", "Air_Pollution", "Alcohol_Use", "Smoking"):
        assert col in str(err.value)
    partial = pd.read_csv(PARTIAL)
    assert partial["Country_Region"].value_counts().to_dict() == COUNTRY_COUNTS


@pytest.mark.shared
def test_generator_matches_the_public_sample():
    sample = load_cancer_csv(SAMPLE)
    gen = generate_cancer_table()
    # the documented formula reproduces every score of the sample (2-decimal rounding)
    assert np.abs(np.round(severity_score(sample), 2) - sample[TARGET]).max() < 1e-9
    # continuous columns: two-sample KS
    for col in ("Age", "Year", "Treatment_Cost_USD", "Survival_Years", TARGET, *RISK_FACTORS):
        p = stats.ks_2samp(sample[col], gen[col]).pvalue
        assert p > 0.001, f"{col}: KS p = {p:.2g}"
        lo, hi = sample[col].min(), sample[col].max()
        assert gen[col].min() <= lo + 0.5 and gen[col].max() >= hi - 0.5, col
    # categorical columns: chi-square of the sample's counts against the generator's frequencies
    for col, cats in (("Gender", GENDERS), ("Cancer_Type", CANCER_TYPES), ("Cancer_Stage", CANCER_STAGES)):
        obs = sample[col].value_counts().reindex(cats).to_numpy()
        exp = gen[col].value_counts(normalize=True).reindex(cats).to_numpy() * len(sample)
        p = stats.chisquare(obs, exp).pvalue
        assert p > 0.001, f"{col}: chi-square p = {p:.2g}"
    # independence of the inputs, as in the sample
    corr = gen.drop(columns=[TARGET]).corr(numeric_only=True).to_numpy()
    np.fill_diagonal(corr, 0)
    assert np.abs(corr).max() < 0.03


@pytest.mark.shared
def test_anonymization_report_on_the_real_partial_file(tmp_path):
    from flower_apps.tabular_pdp.real_table import partial_table_report, write_partial_report

    rep = partial_table_report(PARTIAL, regions=["Australia", "USA"])
    assert rep["quasi_identifiers"] == ["Age", "Gender", "Cancer_Type"] and rep["levels"] == [1, 0, 0]
    assert rep["missing_columns"] == ["Patient_ID", "Year", "Air_Pollution", "Alcohol_Use", "Smoking"]
    for row in rep["rows"]:
        assert row["k"] >= 5 and 0.06 < row["ARIREC"] < 0.08 and row["records"] + row["suppressed"] in (5092, 5060)
    assert "real records" in write_partial_report(rep, tmp_path).lower()
