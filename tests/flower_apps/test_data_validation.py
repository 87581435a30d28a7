"""Bad data fails on the server, before any work: one DataError, one line, no run folder, no message sent."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from datasets.base import DataError, DatasetUnavailableError
from datasets.cancer import CancerSchemaError, generate_cancer_table
from flower_apps.router import prepare


class UnusableGrid:
    """A Grid that fails the test the moment anything touches it: validation must come first."""

    def __getattr__(self, name):
        raise AssertionError(f"grid.{name} was used before the data was validated")


def _run_server(tmp_path: Path, run_config: dict) -> DataError:
    """Build the config like the router does, call the study's server_main; return the DataError it raised."""
    results = tmp_path / "results"
    spec, cfg = prepare({**run_config, "results-dir": str(results)})
    with pytest.raises(DataError) as err:
        spec.server_main(UnusableGrid(), cfg)
    assert not results.exists(), f"a run folder was created: {sorted(results.rglob('*'))}"
    msg = str(err.value)
    assert "\n" not in msg and msg.strip() == msg, msg
    return err.value


@pytest.fixture
def cancer_table():
    return generate_cancer_table(seed=1, country_counts={"A": 30, "B": 20})


def _tabular(csv: Path) -> dict:
    return {"study": "tabular-pdp", "preset": "smoke", "dataset": "cancer-csv", "data-dir": str(csv),
            "num-clients": 2, "tab-clip-mode": "fixed"}


def test_csv_with_a_wrong_type_names_the_file_and_the_column(tmp_path, cancer_table):
    bad = cancer_table.astype({"Age": object})
    bad.loc[3, "Age"] = "forty"
    csv = tmp_path / "wrong_type.csv"
    bad.to_csv(csv, index=False)
    err = _run_server(tmp_path, _tabular(csv))
    assert isinstance(err, CancerSchemaError)
    assert str(err) == f"{csv}: column Age must be numeric (int), got 'forty' (data row 4)"


def test_csv_missing_a_column_names_the_file_and_the_column(tmp_path, cancer_table):
    csv = tmp_path / "no_smoking.csv"
    cancer_table.drop(columns=["Smoking"]).to_csv(csv, index=False)
    err = _run_server(tmp_path, _tabular(csv))
    assert isinstance(err, CancerSchemaError)
    assert str(err).startswith(f"{csv}: missing column(s) Smoking; expected the 15 columns Patient_ID, ")


def test_valid_csv_passes_validation_and_the_grid_is_the_next_thing_used(tmp_path, cancer_table):
    # the counterpart of the tests above: validation lets good data through to the message rounds
    csv = tmp_path / "ok.csv"
    cancer_table.to_csv(csv, index=False)
    spec, cfg = prepare({**_tabular(csv), "results-dir": str(tmp_path / "results")})
    with pytest.raises(AssertionError, match="grid.* was used"):
        spec.server_main(UnusableGrid(), cfg)


def _busi(root: Path, empty: str | None = None) -> Path:
    for k, cls in enumerate(("normal", "benign", "malignant")):
        (root / cls).mkdir(parents=True)
        if cls != empty:
            cv2.imwrite(str(root / cls / f"{cls} (1).png"), np.full((8, 8), 40 * (k + 1), np.uint8))
    return root


def test_empty_busi_class_folder_is_named(tmp_path):
    root = _busi(tmp_path / "busi", empty="normal")
    # the smoke preset allows a synthetic fallback: an explicit folder with a wrong layout must not use it
    err = _run_server(tmp_path, {"study": "ultrasound", "preset": "smoke", "data-dir": str(root)})
    assert str(err) == f"BUSI: expected PNG images in {root / 'normal'} but the folder is empty"


def test_busi_data_dir_that_does_not_exist_says_so(tmp_path):
    missing = tmp_path / "typo" / "busi"
    err = _run_server(tmp_path, {"study": "ultrasound", "preset": "smoke", "data-dir": str(missing)})
    assert isinstance(err, DatasetUnavailableError)
    assert str(err).startswith(f"data-dir '{missing}' does not exist; expected a BUSI folder with normal/")
    assert "BUSI not found" not in str(err)


@pytest.mark.parametrize("study,preset,dataset", [
    ("dfl-dp", "reduced", "mnist"),  # 'mnist' used to fall back to the 5,000-digit subset on a mistyped path
    ("dfl-dp", "smoke", "mnist-full"),
    ("dfl-dp", "smoke", "fashion-mnist"),
    ("unlinkable-dfl", "paper", "mnist"),
])
def test_idx_data_dir_that_does_not_exist_says_so(tmp_path, study, preset, dataset):
    missing = tmp_path / "typo" / "mnist"
    err = _run_server(tmp_path, {"study": study, "preset": preset, "dataset": dataset, "data-dir": str(missing)})
    assert isinstance(err, DatasetUnavailableError)
    assert str(err).startswith(f"data-dir '{missing}' does not exist; expected a folder with the four ")


def test_malformed_idx_file_names_the_file(tmp_path):
    d = tmp_path / "mnist"
    d.mkdir()
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (d / stem).write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 5)  # uint8, 3 dims: header cut short
    err = _run_server(tmp_path, {"study": "dfl-dp", "preset": "smoke", "dataset": "mnist-full",
                                 "data-dir": str(d)})
    assert str(err).startswith(f"{d / 'train-images-idx3-ubyte'}: truncated IDX header")


def test_cancer_schema_error_is_a_data_error():
    assert issubclass(CancerSchemaError, DataError) and issubclass(DatasetUnavailableError, DataError)
    assert issubclass(DataError, ValueError) and issubclass(DatasetUnavailableError, FileNotFoundError)
