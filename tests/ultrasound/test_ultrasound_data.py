"""BUSI / BreastMNIST / synthetic loaders, tasks and the study's splits."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from datasets import busi
from datasets.base import DatasetUnavailableError
from datasets.busi import (
    BUSI_CLASSES,
    TASKS,
    DatasetLayoutError,
    find_busi_root,
    global_splits,
    load_breastmnist,
    load_busi,
    load_ultrasound,
    synthetic_ultrasound,
)

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"  # as tests/conftest.py


def _png(path, value: int, size: int = 12, rgb: bool = True) -> None:
    img = np.full((size, size, 3) if rgb else (size, size), value, dtype=np.uint8)
    cv2.imwrite(str(path), img)


@pytest.fixture
def busi_folder(tmp_path):
    """A tiny BUSI-layout folder with mask files (which must be ignored)."""
    root = tmp_path / "busi" / "Dataset_BUSI_with_GT"
    counts = {"normal": 2, "benign": 3, "malignant": 4}
    for k, (cls, n) in enumerate(counts.items()):
        (root / cls).mkdir(parents=True)
        for i in range(1, n + 1):
            _png(root / cls / f"{cls} ({i}).png", 40 * (k + 1))
            _png(root / cls / f"{cls} ({i})_mask.png", 255, rgb=False)
        _png(root / cls / f"{cls} (1)_mask_1.png", 255, rgb=False)
    return tmp_path / "busi", counts


def test_busi_loader_skips_masks_and_labels_by_folder(busi_folder):
    base, counts = busi_folder
    ds = load_busi(base)  # the folder *containing* Dataset_BUSI_with_GT also works
    assert ds.class_counts() == counts
    assert len(ds.images) == 9 and not ds.synthetic
    assert "mask files ignored" in ds.notes[0] and "(12 mask files ignored)" in ds.notes[0]
    # grayscale decode; value 40 * (class + 1) identifies the folder
    for img, y in zip(ds.images, ds.labels):
        assert img.shape == (12, 12) and int(img[0, 0]) == 40 * (y + 1)


def test_find_busi_root_and_explicit_data_dir(busi_folder):
    base, _ = busi_folder
    assert find_busi_root(base) == base / "Dataset_BUSI_with_GT"
    ds = load_ultrasound("busi", base.parent)  # data-dir one level further up: <dir>/busi/Dataset_BUSI_with_GT
    assert len(ds.labels) == 9


def test_wrong_layout_names_expected_folder_and_what_was_found(tmp_path):
    (tmp_path / "benign").mkdir()
    (tmp_path / "images").mkdir()
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(DatasetLayoutError) as err:
        load_ultrasound("busi", tmp_path)
    msg = str(err.value)
    assert str(tmp_path) in msg and "['normal', 'malignant']" in msg
    assert "images/" in msg and "readme.txt" in msg


def test_class_folder_with_only_masks_is_an_error(busi_folder):
    base, _ = busi_folder
    normal = base / "Dataset_BUSI_with_GT" / "normal"
    for p in normal.glob("normal (?).png"):
        p.unlink()
    with pytest.raises(DatasetLayoutError, match="normal"):
        load_busi(base)


def test_missing_data_fails_with_where_to_put_it_unless_smoke_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(busi, "BUSI_DEFAULT_DIRS", (tmp_path / "nothing-here",))  # no BUSI on this "machine"
    with pytest.raises(DatasetUnavailableError, match="Dataset_BUSI_with_GT"):
        load_ultrasound("busi")
    ds = load_ultrasound("busi", allow_synthetic_fallback=True, synthetic_size=16)
    assert ds.synthetic and ds.name == "synthetic-ultrasound"
    assert any("fallback" in n for n in ds.notes) and any("SYNTHETIC" in n for n in ds.notes)
    # an explicit data-dir that does not exist is a mistake to report, not a reason to fall back
    with pytest.raises(DatasetUnavailableError, match="^data-dir '.*nothing-here' does not exist"):
        load_ultrasound("busi", tmp_path / "nothing-here", allow_synthetic_fallback=True)


def test_breastmnist_npz_is_binary_and_pooled(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {}
    for part, n in (("train", 6), ("val", 2), ("test", 3)):
        arrays[f"{part}_images"] = rng.integers(0, 255, (n, 28, 28), dtype=np.uint8)
        arrays[f"{part}_labels"] = rng.integers(0, 2, (n, 1))
    np.savez(tmp_path / "breastmnist.npz", **arrays)
    ds = load_ultrasound("breastmnist", tmp_path)
    assert len(ds.labels) == 11
    medmnist = np.concatenate([arrays[f"{p}_labels"].ravel() for p in ("train", "val", "test")])
    # MedMNIST label 0 = malignant -> base class 'malignant' (1); label 1 = normal/benign -> 0
    np.testing.assert_array_equal(ds.labels, 1 - medmnist)
    assert ds.class_names == ("normal+benign", "malignant")
    keep, y = TASKS["nonmalignant-vs-malignant"].apply(ds.labels, ds.class_names)
    np.testing.assert_array_equal(y, ds.labels)
    with pytest.raises(ValueError, match="nonmalignant-vs-malignant"):
        TASKS["three-class"].apply(ds.labels, ds.class_names)
    np.savez(tmp_path / "bad.npz", x=np.zeros(3))
    with pytest.raises(DatasetLayoutError, match="train_images"):
        load_breastmnist(tmp_path / "bad.npz")


def test_tasks_map_base_labels():
    base = np.array([0, 1, 2, 2, 1, 0])
    keep, y = TASKS["normal-vs-abnormal"].apply(base, BUSI_CLASSES)
    np.testing.assert_array_equal(keep, np.arange(6))
    np.testing.assert_array_equal(y, [0, 1, 1, 1, 1, 0])
    keep, y = TASKS["benign-vs-malignant"].apply(base, BUSI_CLASSES)
    np.testing.assert_array_equal(keep, [1, 2, 3, 4])
    np.testing.assert_array_equal(y, [0, 1, 1, 0])
    keep, y = TASKS["three-class"].apply(base, BUSI_CLASSES)
    np.testing.assert_array_equal(y, base)


def test_splits_test_set_fixed_across_seeds_and_fractions():
    labels = np.repeat([0, 1, 2], [133, 437, 210])
    a, b = global_splits(labels, seed=0), global_splits(labels, seed=5)
    np.testing.assert_array_equal(a["test"], b["test"])  # shared by every setting
    assert not np.array_equal(a["train"], b["train"])
    for s in (a, b):
        assert (len(s["test"]), len(s["train"]), len(s["val"])) == (78, 624, 78)
        allidx = np.concatenate([s["test"], s["train"], s["val"]])
        assert len(np.unique(allidx)) == 780
        for part in ("train", "test", "val"):  # stratified: class shares within 2 points of the global ones
            share = np.bincount(labels[s[part]], minlength=3) / len(s[part])
            assert np.abs(share - np.bincount(labels) / 780).max() < 0.02
    half = global_splits(labels, seed=0, data_fraction=0.5)
    np.testing.assert_array_equal(half["test"], a["test"])
    assert len(half["train"]) + len(half["val"]) == 351


def test_synthetic_is_labelled_and_deterministic():
    a = synthetic_ultrasound((2, 3, 4), size=32, seed=1)
    b = synthetic_ultrasound((2, 3, 4), size=32, seed=1)
    assert a.synthetic and "SYNTHETIC" in a.notes[0]
    assert a.class_counts() == {"normal": 2, "benign": 3, "malignant": 4}
    assert all(np.array_equal(x, y) for x, y in zip(a.images, b.images))
    # lesions are dark: the centre of lesion images is darker on average than normal ones
    centre = lambda i: float(i[12:20, 12:20].mean())
    assert np.mean([centre(i) for i, y in zip(a.images, a.labels) if y > 0]) < np.mean(
        [centre(i) for i, y in zip(a.images, a.labels) if y == 0])


@pytest.mark.shared
def test_shared_busi_has_the_documented_counts():
    ds = load_ultrasound("busi", SHARED_DATA / "busi")
    assert ds.class_counts() == {"normal": 133, "benign": 437, "malignant": 210}
    assert ds.images[0].ndim == 2 and ds.images[0].dtype == np.uint8
