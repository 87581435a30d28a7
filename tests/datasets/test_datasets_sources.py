import gzip
import pickle
import struct

import numpy as np
import pytest

from datasets.base import DatasetUnavailableError
from datasets.idx import read_idx
from datasets.registry import DATASETS, load_dataset, register_dataset
from datasets.sources import FASHION_DEBIAN_DIR, load_cifar10, load_fashion_mnist, load_mnist, load_mnist_idx


def write_idx(path, arr: np.ndarray, gz=True):
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(data)


def make_mnist_dir(d, n=20, raw=True):
    base = d / "MNIST" / "raw" if raw else d
    base.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, m in (("train", n), ("t10k", n // 2)):
        write_idx(base / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 255, (m, 28, 28)))
        write_idx(base / f"{prefix}-labels-idx1-ubyte.gz", np.arange(m) % 10)
    return d


def test_idx_roundtrip_and_bad_magic(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", arr, gz=False)
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-3])
    with pytest.raises(ValueError, match="payload bytes"):
        read_idx(tmp_path / "short")


def test_mnist_from_torchvision_layout(tmp_path):
    ds = load_mnist_idx(make_mnist_dir(tmp_path))
    assert ds.x_train.shape == (20, 28, 28) and ds.x_test.shape == (10, 28, 28)
    assert not ds.reduced and ds.mean == (0.1307,) and ds.std == (0.3081,)


def test_mnist_missing_says_where_and_how(tmp_path):
    with pytest.raises(DatasetUnavailableError, match="train-images-idx3-ubyte.*download=True"):
        load_mnist_idx(tmp_path)  # the folder exists but holds no IDX files


def test_mnist_falls_back_to_reduced_subset(tmp_path, caplog):
    ds = load_mnist(tmp_path)  # the folder exists but holds no IDX files
    assert ds.reduced and ds.x_test is None and len(ds.x_train) == 5000
    assert np.bincount(ds.y_train).tolist() == [500] * 10
    assert "REDUCED" in caplog.text


def test_mnist_data_dir_that_does_not_exist_is_an_error_not_a_fallback(tmp_path):
    with pytest.raises(DatasetUnavailableError, match=f"^data-dir '{tmp_path / 'typo'}' does not exist; expected"):
        load_mnist(tmp_path / "typo")


def test_fashion_mnist_loader(tmp_path):
    make_mnist_dir(tmp_path, raw=False)
    ds = load_fashion_mnist(tmp_path)
    assert ds.name == "fashion-mnist" and len(ds.x_train) == 20


@pytest.mark.skipif(not FASHION_DEBIAN_DIR.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_debian_package():
    ds = load_fashion_mnist()
    assert ds.x_train.shape == (60000, 28, 28) and ds.x_test.shape == (10000, 28, 28)


def test_cifar10_from_pickle_batches(tmp_path):
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(base / name, "wb") as fh:
            pickle.dump({b"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 3]}, fh)
    ds = load_cifar10(tmp_path)
    assert ds.x_train.shape == (20, 32, 32, 3) and ds.image_shape == (3, 32, 32)
    with pytest.raises(DatasetUnavailableError, match="cifar-10-batches-py"):
        load_cifar10(tmp_path / "nope")


def test_registry_refuses_duplicates_and_unknown():
    assert {"mnist", "mnist-5k", "fashion-mnist", "cifar10"} <= set(DATASETS)
    with pytest.raises(ValueError, match="already registered"):
        register_dataset("mnist", lambda d=None: None)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("imagenet")
