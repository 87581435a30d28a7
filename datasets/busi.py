"""Breast-ultrasound sources (BUSI, MedMNIST BreastMNIST, a labelled synthetic generator), tasks and splits.

Sources return raw uint8 images with *base* labels; a :class:`Task` maps base labels to
the task's classes (and drops the ones it does not use). Splits follow the ultrasound
study: a 10% global test set is held out first with a fixed seed (shared by every
setting, seed and task), the remaining 90% splits into 80% train and 10% validation of
the total.

Nothing here downloads anything. The synthetic generator exists for smoke runs and tests
only; its dataset name says so, and :func:`load_ultrasound` uses it for a real source
only when the caller explicitly allows a fallback.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from datasets.base import DataError, DatasetUnavailableError, check_data_dir, one_line
from datasets.sources import DEFAULT_DATA_HOME
from datasets.splits import stratified_split, subsample_stratified
from registry import streams

log = logging.getLogger(__name__)

BUSI_CLASSES = ("normal", "benign", "malignant")
BREASTMNIST_CLASSES = ("normal+benign", "malignant")  # MedMNIST: label 1 = normal/benign, 0 = malignant
BUSI_FOLDER = "Dataset_BUSI_with_GT"
REPO_ROOT = Path(__file__).resolve().parents[1]
BUSI_DEFAULT_DIRS = (REPO_ROOT.parent / "shared" / "data" / "busi", REPO_ROOT / "data" / "busi",
                     DEFAULT_DATA_HOME / "busi")
BREASTMNIST_DEFAULT_DIRS = (REPO_ROOT / "data", REPO_ROOT.parent / "shared" / "data", DEFAULT_DATA_HOME,
                            Path.home() / ".medmnist")
BUSI_HOWTO = (f"put the public BUSI release (folder {BUSI_FOLDER}/ with normal/, benign/, malignant/ PNGs; "
              f"masks are ignored) in one of {[str(d) for d in BUSI_DEFAULT_DIRS]}, or pass data-dir=<folder> "
              f"(under `flwr run` the app runs from Flower's installed copy, not your checkout, so a checkout's "
              f"../shared is not found: pass an absolute data-dir)")

TEST_FRACTION = 0.1
VAL_FRACTION = 0.1
TEST_SPLIT_SEED = 0  # the global test set is the same for every seed and setting


class DatasetLayoutError(DatasetUnavailableError):
    """A data folder exists but does not have the expected layout."""


@dataclass(frozen=True)
class UltrasoundImages:
    """Raw images (uint8, any size, gray or RGB) with base labels indexing ``class_names``."""

    name: str
    images: list[np.ndarray]
    labels: np.ndarray
    class_names: tuple[str, ...]
    source: str
    synthetic: bool = False
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.images) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.images)} images but {len(self.labels)} labels")

    def class_counts(self) -> dict[str, int]:
        return {c: int((self.labels == i).sum()) for i, c in enumerate(self.class_names)}


# ----------------------------------------------------------------------------- BUSI
def is_mask_file(path: Path) -> bool:
    """BUSI segmentation masks are named '<image>_mask.png' or '<image>_mask_1.png'."""
    return "_mask" in path.stem


def find_busi_root(data_dir: str | Path | None = None) -> Path | None:
    """The folder holding normal/, benign/, malignant/ -- searched in ``data_dir`` or the defaults."""
    bases = [Path(data_dir)] if data_dir else list(BUSI_DEFAULT_DIRS)
    for base in bases:
        for cand in (base, base / BUSI_FOLDER, base / "busi" / BUSI_FOLDER):
            if all((cand / c).is_dir() for c in BUSI_CLASSES):
                return cand
    return None


def _describe(folder: Path) -> str:
    if not folder.exists():
        return "the folder does not exist"
    if not folder.is_dir():
        return "it is a file, not a folder"
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    return f"found {entries[:12]}{' ...' if len(entries) > 12 else ''}" if entries else "the folder is empty"


def load_busi(root: str | Path) -> UltrasoundImages:
    """Load a BUSI folder ``root/{normal,benign,malignant}/*.png``; mask files are skipped.

    ``root`` may also be the folder that contains ``Dataset_BUSI_with_GT``. A wrong layout
    raises :class:`DatasetLayoutError` naming the folder expected and what was found.
    """
    root = Path(root)
    if not all((root / c).is_dir() for c in BUSI_CLASSES) and (root / BUSI_FOLDER).is_dir():
        root = root / BUSI_FOLDER
    missing = [c for c in BUSI_CLASSES if not (root / c).is_dir()]
    if missing:
        raise DatasetLayoutError(f"BUSI: expected {root} to contain the class folders {list(BUSI_CLASSES)} "
                                 f"(the public {BUSI_FOLDER}/ layout) but {missing} are missing; {_describe(root)}")
    images, labels, masks = [], [], 0
    for k, cls in enumerate(BUSI_CLASSES):
        files = sorted(p for p in (root / cls).iterdir() if p.suffix.lower() == ".png")
        kept = [p for p in files if not is_mask_file(p)]
        masks += len(files) - len(kept)
        if not kept:
            raise DatasetLayoutError(f"BUSI: expected PNG images in {root / cls} but {_describe(root / cls)}")
        for p in kept:
            img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
            if img is None:
                raise DatasetLayoutError(f"BUSI: could not decode {p}")
            images.append(img)
            labels.append(k)
    notes = [f"BUSI from {root}: {len(images)} images" + (f" ({masks} mask files ignored)" if masks else "")]
    return UltrasoundImages("busi", images, np.asarray(labels, dtype=np.int64), BUSI_CLASSES, str(root), False, notes)


# ----------------------------------------------------------------------------- BreastMNIST
def find_breastmnist(data_dir: str | Path | None = None) -> Path | None:
    """A ``breastmnist*.npz`` file: ``data_dir`` itself, or the first match in it / the defaults."""
    if data_dir and Path(data_dir).is_file():
        return Path(data_dir)
    bases = [Path(data_dir)] if data_dir else list(BREASTMNIST_DEFAULT_DIRS)
    for base in bases:
        if base.is_dir():
            hits = sorted(base.glob("breastmnist*.npz"))
            if hits:
                return hits[0]
    return None


def load_breastmnist(path: str | Path) -> UltrasoundImages:
    """MedMNIST BreastMNIST (binary: 0 malignant, 1 normal+benign); train/val/test are pooled so the
    study's own splits apply. Base labels are re-indexed to ``BREASTMNIST_CLASSES``."""
    path = Path(path)
    try:
        z = np.load(path)
    except (OSError, EOFError, ValueError) as exc:
        raise DatasetLayoutError(f"BreastMNIST: {path} is not a readable .npz file ({one_line(exc)})") from exc
    if not hasattr(z, "files"):  # np.load also reads a bare .npy array
        raise DatasetLayoutError(f"BreastMNIST: expected an .npz archive with train_images/train_labels/... "
                                 f"in {path}, got a single array")
    with z:
        parts = [k for k in ("train", "val", "test") if f"{k}_images" in z]
        if not parts:
            raise DatasetLayoutError(f"BreastMNIST: expected arrays train_images/train_labels/... in {path}, "
                                     f"found {sorted(z.files)}")
        absent = [f"{k}_labels" for k in parts if f"{k}_labels" not in z]
        if absent:
            raise DatasetLayoutError(f"BreastMNIST: {path} has images but no {', '.join(absent)}")
        x = np.concatenate([z[f"{k}_images"] for k in parts])
        y = np.concatenate([z[f"{k}_labels"].reshape(-1) for k in parts]).astype(np.int64)
    if len(x) != len(y):
        raise DatasetLayoutError(f"BreastMNIST: {path} has {len(x)} images but {len(y)} labels")
    if x.dtype != np.uint8:
        raise DatasetLayoutError(f"BreastMNIST: expected uint8 images in {path}, got {x.dtype}")
    base = np.where(y == 1, 0, 1)  # 1 (normal, benign) -> 0 'normal+benign'; 0 (malignant) -> 1
    notes = [f"BreastMNIST from {path}: {len(x)} images ({'+'.join(parts)} pooled; binary labels only)"]
    return UltrasoundImages("breastmnist", list(x), base, BREASTMNIST_CLASSES, str(path), False, notes)


# ----------------------------------------------------------------------------- synthetic
def synthetic_ultrasound(counts: tuple[int, int, int] = (133, 437, 210), size: int = 128,
                         seed: int = 0) -> UltrasoundImages:
    """SYNTHETIC ultrasound-like images for smoke runs and tests -- never for reported results.

    Speckle (Rayleigh) over layered tissue with depth attenuation; benign: a smooth
    hypoechoic ellipse with posterior enhancement; malignant: an irregular (spiculated)
    hypoechoic mass with posterior shadowing; normal: no lesion. Class counts default to
    BUSI's (133 normal, 437 benign, 210 malignant).
    """
    rng = streams.rng("datasets.busi-subsample", seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    images, labels = [], []
    for k, n in enumerate(counts):
        for _ in range(n):
            bands = 0.5 + 0.2 * np.sin(2 * np.pi * (yy * rng.uniform(2, 5) + rng.uniform(0, 1)))
            tissue = bands * np.exp(-yy * rng.uniform(0.3, 1.0))
            if k > 0:
                cy, cx = rng.uniform(0.35, 0.65, 2)
                ry, rx = rng.uniform(0.08, 0.18), rng.uniform(0.1, 0.22)
                ang = np.arctan2(yy - cy, xx - cx)
                r = np.sqrt(((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2)
                if k == 2:  # spiculated margin
                    r = r * (1 + 0.35 * np.sin(ang * rng.integers(5, 11) + rng.uniform(0, 6.3)))
                lesion = r < 1.0
                tissue = np.where(lesion, 0.08, tissue)
                below = (yy > cy) & (np.abs(xx - cx) < rx)
                tissue = np.where(below & ~lesion, tissue * (1.5 if k == 1 else 0.45), tissue)
            speckle = rng.rayleigh(1.0, (size, size)) / 1.25
            img = np.clip(255 * tissue * speckle, 0, 255).astype(np.uint8)
            images.append(img)
            labels.append(k)
    note = f"SYNTHETIC ultrasound-like images (seed {seed}): for smoke runs and tests only, not real data"
    return UltrasoundImages("synthetic-ultrasound", images, np.asarray(labels, dtype=np.int64), BUSI_CLASSES,
                            "datasets.busi.synthetic_ultrasound", True, [note])


# ----------------------------------------------------------------------------- dispatch
ULTRASOUND_SOURCES = ("busi", "breastmnist", "synthetic")


def load_ultrasound(name: str, data_dir: str | Path | None = None, *, allow_synthetic_fallback: bool = False,
                    synthetic_size: int = 128) -> UltrasoundImages:
    """Load ``name`` ('busi', 'breastmnist' or 'synthetic').

    A missing real source raises :class:`DatasetUnavailableError` saying where to put it,
    unless ``allow_synthetic_fallback`` (smoke runs), in which case the synthetic set is
    returned with a loud warning and a note in its ``notes``. An explicit ``data_dir`` that
    does not exist, or that exists with a wrong layout, is always an error: the fallback
    covers "no BUSI on this machine", not a mistyped path.
    """
    if name not in ULTRASOUND_SOURCES:
        raise DataError(f"unknown ultrasound dataset {name!r}; allowed: {list(ULTRASOUND_SOURCES)}")
    if name == "synthetic":
        return synthetic_ultrasound(size=synthetic_size)
    if name == "busi":
        check_data_dir(data_dir, f"a BUSI folder with {', '.join(c + '/' for c in BUSI_CLASSES)} "
                                 f"(or {BUSI_FOLDER}/ holding them)")
        root = find_busi_root(data_dir)
        if root is not None:
            return load_busi(root)
        if data_dir:
            return load_busi(data_dir)  # an explicit path with a wrong layout is an error, not a fallback
        msg = f"BUSI not found: {BUSI_HOWTO}"
    else:
        check_data_dir(data_dir, "breastmnist.npz (from medmnist) or a folder holding breastmnist*.npz")
        path = find_breastmnist(data_dir)
        if path is not None:
            return load_breastmnist(path)
        if data_dir:  # an explicit folder without the file is an error, not a fallback
            raise DatasetLayoutError(f"BreastMNIST: expected breastmnist*.npz in data-dir '{data_dir}' but "
                                     f"{_describe(Path(data_dir))}")
        msg = ("BreastMNIST not found: put breastmnist.npz (or breastmnist_<size>.npz, from medmnist) in one of "
               f"{[str(d) for d in BREASTMNIST_DEFAULT_DIRS]}, or pass data-dir=<file or folder>")
    if not allow_synthetic_fallback:
        raise DatasetUnavailableError(msg)
    log.warning("%s -- SMOKE RUN FALLS BACK TO SYNTHETIC DATA (not for reporting)", msg)
    syn = synthetic_ultrasound(size=synthetic_size)
    syn.notes.append(f"fallback: {name} was not found, so this smoke run used synthetic images")
    return syn


# ----------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class Task:
    """A classification task over base classes; ``mapping`` sends a base class to a task label or None (dropped)."""

    name: str
    class_names: tuple[str, ...]
    mapping: dict[str, int | None]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def apply(self, labels: np.ndarray, base_classes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(kept indices, task labels) for base ``labels``; refuses bases this task does not define."""
        unknown = [c for c in base_classes if c not in self.mapping]
        if unknown:
            usable = [t.name for t in TASKS.values() if all(c in t.mapping for c in base_classes)]
            raise ValueError(f"task {self.name!r} is not defined for base classes {list(base_classes)} "
                             f"(unknown: {unknown}); tasks for this dataset: {usable}")
        lut = np.array([-1 if self.mapping[c] is None else self.mapping[c] for c in base_classes], dtype=np.int64)
        mapped = lut[np.asarray(labels)]
        keep = np.flatnonzero(mapped >= 0)
        return keep, mapped[keep]


TASKS: dict[str, Task] = {
    "normal-vs-abnormal": Task("normal-vs-abnormal", ("normal", "abnormal"),
                               {"normal": 0, "benign": 1, "malignant": 1}),
    "benign-vs-malignant": Task("benign-vs-malignant", ("benign", "malignant"),
                                {"normal": None, "benign": 0, "malignant": 1}),
    "three-class": Task("three-class", BUSI_CLASSES, {"normal": 0, "benign": 1, "malignant": 2}),
    # BreastMNIST's only task (its labels merge normal and benign).
    "nonmalignant-vs-malignant": Task("nonmalignant-vs-malignant", ("normal+benign", "malignant"),
                                      {"normal": 0, "benign": 0, "normal+benign": 0, "malignant": 1}),
}


# ----------------------------------------------------------------------------- splits
def global_splits(labels: np.ndarray, seed: int, data_fraction: float = 1.0) -> dict[str, np.ndarray]:
    """{'test', 'train', 'val'} indices: 10% test first (fixed seed), then 80% / 10% of the total.

    Stratified on ``labels`` (pass base labels so that every task shares the test set).
    ``data_fraction`` < 1 subsamples the non-test pool (stratified, by ``seed``).
    """
    labels = np.asarray(labels)
    rest, test = stratified_split(labels, [1 - TEST_FRACTION, TEST_FRACTION],
                                  streams.rng("datasets.test-split", TEST_SPLIT_SEED))
    if data_fraction < 1:
        rest = rest[subsample_stratified(labels[rest], data_fraction, seed)]
    val_share = VAL_FRACTION / (1 - TEST_FRACTION)
    train_rel, val_rel = stratified_split(labels[rest], [1 - val_share, val_share], streams.rng("datasets.busi-val", seed))
    return {"test": np.sort(test), "train": np.sort(rest[train_rel]), "val": np.sort(rest[val_rel])}
