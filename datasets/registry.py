"""Name -> loader registry for image datasets (refuses duplicate names)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from datasets.base import ArrayDataset, DataError
from datasets.sources import load_cifar10, load_fashion_mnist, load_mnist, load_mnist_idx, load_mnist_subset

Loader = Callable[[str | Path | None], ArrayDataset]
DATASETS: dict[str, Loader] = {}


def register_dataset(name: str, loader: Loader) -> None:
    """Register ``loader`` under ``name``; a second registration of the same name is an error."""
    if name in DATASETS:
        raise ValueError(f"dataset {name!r} is already registered")
    DATASETS[name] = loader


def _load_mnist_5k(_data_dir: str | Path | None = None) -> ArrayDataset:
    return load_mnist_subset()  # the packaged subset: no data directory


register_dataset("mnist", load_mnist)  # full if present, else the offline subset
register_dataset("mnist-full", load_mnist_idx)
register_dataset("mnist-5k", _load_mnist_5k)
register_dataset("fashion-mnist", load_fashion_mnist)
register_dataset("cifar10", load_cifar10)


def load_dataset(name: str, data_dir: str | Path | None = None) -> ArrayDataset:
    """Load a registered dataset by name; an unknown name or unusable files raise :class:`DataError`."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; allowed: {sorted(DATASETS)}")
    return DATASETS[name](data_dir)
