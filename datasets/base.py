"""The in-memory image dataset every loader returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """A dataset that cannot be used.

    The message is one line naming the file, column or path at fault and what was
    expected, so that a run stops with that line instead of a traceback per client.
    """


class DatasetUnavailableError(DataError, FileNotFoundError):
    """A dataset's files are not on this machine (or not where data-dir says); the message says how to get them."""


def one_line(text: object) -> str:
    """``text`` with its line breaks and runs of whitespace collapsed (library messages span lines)."""
    return " ".join(str(text).split())


def check_data_dir(data_dir: str | Path | None, expected: str) -> Path | None:
    """``data_dir`` as a Path (None when not given); a given path that does not exist is an error.

    Without this check a typo in data-dir reads as "dataset not found, put it in <defaults>"
    or, worse, silently falls back to a reduced or synthetic source.

    Parameters
    ----------
    data_dir : the run's data-dir ('' or None: not given).
    expected : what the path should hold, for the message ("the MNIST IDX files or their folder").
    """
    if not data_dir:
        return None
    path = Path(data_dir)
    if not path.exists():
        raise DatasetUnavailableError(f"data-dir '{path}' does not exist; expected {expected}")
    return path


@dataclass(frozen=True)
class ArrayDataset:
    """Images as uint8 ``(n, H, W)`` or ``(n, H, W, C)`` arrays plus int64 labels.

    ``x_test``/``y_test`` are ``None`` when the source has no separate test set
    (the offline 5,000-digit MNIST subset); callers then hold out a stratified
    test part (see :func:`datasets.splits.stratified_holdout`).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    reduced: bool = False
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.x_train) != len(self.y_train):
            raise ValueError(
                f"{self.name}: x_train has {len(self.x_train)} rows but y_train has {len(self.y_train)}"
            )
        if (self.x_test is None) != (self.y_test is None):
            raise ValueError(f"{self.name}: x_test and y_test must both be set or both be None")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """Shape of one image as (C, H, W)."""
        s = self.x_train.shape[1:]
        return (1, s[0], s[1]) if len(s) == 2 else (s[2], s[0], s[1])
